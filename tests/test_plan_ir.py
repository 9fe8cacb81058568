"""The plan IR's construction rules: user-facing constructors check every step; synthesizers may build steps
unchecked (`Step.unchecked`), and `validate` then holds the plan to the same rules."""

import pytest

from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, PlanError, RankProgram, Step, validate
from jaxcoll.synth import forest
from jaxcoll.topology import preset

IN, OUT = Buffer.INPUT, Buffer.OUTPUT


def one_step_plan(step: Step) -> Plan:
    """A 2-rank all_gather whose rank 0 runs `step` (and holds one semaphore)."""
    ranks = (RankProgram(1, 2, semaphores=1, lanes=(Lane((step,)),)), RankProgram(1, 2))
    return Plan(Collective.ALL_GATHER, 2, ranks)


def test_constructors_accept_strings_and_lists_and_store_members_and_tuples():
    step = Step("put", [ChunkRef(0, "input", 0)], [ChunkRef(1, "output", 0)])
    assert step.op is Op.PUT and step.srcs[0].buffer is IN and isinstance(step.dsts, tuple)


@pytest.mark.parametrize("make, message", [
    (lambda: ChunkRef(0, IN, 0, count=0), "chunk count must be >= 1"),
    (lambda: ChunkRef(0, IN, -1), "chunk index must be >= 0"),
    (lambda: ChunkRef(0, "stack", 0), "'stack' is not a valid Buffer"),
    (lambda: Step(Op.PUT, (ChunkRef(0, IN, 0),), ()), "put step needs at least one destination chunk"),
    (lambda: Step(Op.PUT, (ChunkRef(0, IN, 0, 2),), (ChunkRef(1, OUT, 0),)), r"mixes chunk counts \[1, 2\]"),
    (lambda: Step(Op.WAIT, sem=-1), "wait step needs a semaphore index >= 0"),
])
def test_user_constructors_reject_malformed_steps(make, message):
    with pytest.raises((PlanError, ValueError), match=message):
        make()


def test_an_unchecked_step_equals_the_checked_one():
    srcs, dsts = (ChunkRef(0, IN, 0),), (ChunkRef(1, OUT, 0),)
    fast = Step.unchecked(Op.PUT, (ChunkRef.unchecked(0, IN, 0),), dsts)
    assert fast == Step(Op.PUT, srcs, dsts) and hash(fast) == hash(Step(Op.PUT, srcs, dsts))
    assert validate(one_step_plan(fast)) is not None


@pytest.mark.parametrize("step, message", [
    (Step.unchecked(Op.PUT, (ChunkRef.unchecked(0, IN, 0),), ()), "put step needs at least one destination chunk"),
    (Step.unchecked(Op.ZERO, (ChunkRef.unchecked(0, IN, 0),), (ChunkRef.unchecked(1, OUT, 0),)),
     "zero step takes no sources"),
    (Step.unchecked(Op.PUT, (ChunkRef.unchecked(0, IN, 0, 2),), (ChunkRef.unchecked(1, OUT, 0),)),
     r"mixes chunk counts \[1, 2\]"),
    (Step.unchecked(Op.PUT, (ChunkRef.unchecked(0, IN, 0, 0),), (ChunkRef.unchecked(1, OUT, 0, 0),)),
     "chunk count must be >= 1"),
    (Step.unchecked(Op.PUT, (ChunkRef.unchecked(0, IN, -1),), (ChunkRef.unchecked(1, OUT, 0),)),
     "chunk index must be >= 0"),
    (Step.unchecked(Op.PUT, (ChunkRef.unchecked(0, "stack", 0),), (ChunkRef.unchecked(1, OUT, 0),)),
     "'stack' is not a valid Buffer"),
    (Step.unchecked(Op.PUT, (ChunkRef.unchecked(0, "input", 0),), (ChunkRef.unchecked(1, OUT, 0),)),
     "names its op and buffers by their Op and Buffer members"),
    (Step.unchecked("put", (ChunkRef.unchecked(0, IN, 0),), (ChunkRef.unchecked(1, OUT, 0),)),
     "names its op and buffers by their Op and Buffer members, got op='put'"),
    (Step.unchecked(Op.WAIT, sem=-1), "wait step needs a semaphore index >= 0"),
    (Step.unchecked(Op.SIGNAL, peer=-1, sem=0), "signal step needs a peer rank >= 0"),
    (Step.unchecked(Op.BARRIER, channel=2), "barrier step moves no data but names channel=2"),
    (Step.unchecked(Op.PUT, (ChunkRef.unchecked(0, IN, 0),), (ChunkRef.unchecked(1, OUT, 0),), channel=-2),
     "channel must be >= 0"),
])
def test_validate_rejects_unchecked_steps_the_constructors_would_reject(step, message):
    with pytest.raises(PlanError, match=f"rank 0, lane 0, step 0: .*{message}"):
        validate(one_step_plan(step))


def test_validate_names_the_range_fault_of_an_unchecked_step_as_of_a_checked_one():
    step = Step.unchecked(Op.PUT, (ChunkRef.unchecked(0, IN, 0),), (ChunkRef.unchecked(1, OUT, 5),))
    with pytest.raises(PlanError, match=r"r1.output\[5\] is out of range: rank 1's output buffer holds 2 chunks"):
        validate(one_step_plan(step))


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_reduce"])
def test_a_synthesized_plan_survives_the_file_round_trip_and_the_checked_constructors(collective):
    plan = forest(preset("dgx-h100", 1), collective, 2)
    assert Plan.from_json(plan.to_json()) == plan
