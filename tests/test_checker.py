"""The proving checker: plans that compute their collective pass; each kind of fault is reported with the rank,
lane and step at fault and what was expected."""

import dataclasses

import pytest

from jaxcoll.algorithms import BUILTINS, builtin
from jaxcoll.lang import PlanError, check
from jaxcoll.lang.postcondition import value
from jaxcoll.plan import Collective, Lane, Op, Plan, RankProgram, Step
from test_lang_plans import IN, OUT, SCR, example_plans, lane, put, ref, signal, two_rank_all_gather, wait


def replace_lane(plan, rank, steps, lane_index=0):
    ranks = list(plan.ranks)
    lanes = list(ranks[rank].lanes)
    lanes[lane_index] = Lane(tuple(steps))
    ranks[rank] = dataclasses.replace(ranks[rank], lanes=tuple(lanes))
    return dataclasses.replace(plan, ranks=tuple(ranks))


def test_plan_error_is_the_plan_layers_error():
    import jaxcoll.plan
    assert PlanError is jaxcoll.plan.PlanError


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("collective,name", [(c, a) for c, d in BUILTINS.items() for a in d])
def test_every_builtin_plan_is_proved(collective, name, n):
    kw = {}
    if collective is Collective.BROADCAST:
        kw = {"root": n - 1}
    if collective is Collective.PPERMUTE:
        kw = {"perm": tuple((i, (i + 1) % n) for i in range(n - 1))}
    check(builtin(collective, name, n, **kw))


@pytest.mark.parametrize("name,plan", example_plans(), ids=[i for i, _ in example_plans()])
def test_every_example_plan_is_proved(name, plan):
    check(plan, postcondition=None if plan.collective is not Collective.CUSTOM else
          (lambda r, i: None if r == 0 else value([(r - 1, i)])))


def test_handwritten_all_gather_passes():
    check(two_rank_all_gather())


def test_missing_wait_is_a_race_naming_both_steps():
    p = two_rank_all_gather()
    steps = list(p.ranks[1].lanes[0].steps)
    del steps[1]  # rank 1 no longer waits before forwarding... and a signal is left unmatched
    with pytest.raises(PlanError, match=r"rank 0, lane 0, step 2 .*signal number 1 to semaphore 0 of rank 1 "
                                        r"has no matching wait"):
        check(replace_lane(p, 1, steps))


def test_wait_without_signal_names_the_wait():
    p = two_rank_all_gather()
    steps = list(p.ranks[0].lanes[0].steps)
    del steps[2]  # rank 0 never signals rank 1
    with pytest.raises(PlanError, match=r"rank 1, lane 0, step 1 \(wait\(sem0\)\): wait number 1 on semaphore 0 "
                                        r"of rank 1 has no matching signal"):
        check(replace_lane(p, 0, steps))


def test_deadlock_reports_the_stuck_lanes():
    # each rank waits before it signals: a cycle of waits
    progs = tuple(RankProgram(1, 1, semaphores=1, lanes=(lane(
        wait(), Step(Op.COPY, (ref(r, IN, 0),), (ref(r, OUT, 0),)), signal(1 - r)),)) for r in range(2))
    plan = Plan(Collective.ALL_GATHER, 2, progs, in_blocks=1, out_blocks=1, name="cycle")
    with pytest.raises(PlanError, match=r"deadlock: rank 0, lane 0, step 0 \(wait\(sem0\)\) waits for a signal.*"
                                        r"rank 1, lane 0, step 0"):
        check(plan)


def test_race_between_writer_and_reader_on_two_ranks():
    # rank 0 puts into rank 1's scratch while rank 1 reads it, unordered
    r0 = RankProgram(1, 1, 1, lanes=(lane(put(ref(0, IN, 0), ref(1, SCR, 0)),
                                          Step(Op.READ_REDUCE, (ref(0, IN, 0), ref(1, IN, 0)), (ref(0, OUT, 0),))),))
    r1 = RankProgram(1, 1, 1, lanes=(lane(Step(Op.REDUCE, (ref(1, SCR, 0), ref(1, IN, 0)), (ref(1, OUT, 0),))),))
    with pytest.raises(PlanError, match=r"race on r1.scratch\[0\]: rank 0, lane 0, step 0 .* writes it and "
                                        r"rank 1, lane 0, step 0 .* reads it"):
        check(Plan(Collective.ALL_REDUCE, 2, (r0, r1)))


def test_race_between_two_lanes_of_a_rank():
    two = (lane(Step(Op.COPY, (ref(0, IN, 0),), (ref(0, OUT, 0),))),
           lane(Step(Op.COPY, (ref(0, IN, 0),), (ref(0, OUT, 0),))))
    with pytest.raises(PlanError, match=r"race on r0.output\[0\]: rank 0, lane 0.*rank 0, lane 1"):
        check(Plan(Collective.ALL_REDUCE, 1, (RankProgram(1, 1, lanes=two),)))


def test_barrier_orders_lanes_of_a_rank():
    two = (lane(Step(Op.COPY, (ref(0, IN, 0),), (ref(0, SCR, 0),)), Step(Op.BARRIER)),
           lane(Step(Op.BARRIER), Step(Op.COPY, (ref(0, SCR, 0),), (ref(0, OUT, 0),))))
    check(Plan(Collective.ALL_REDUCE, 1, (RankProgram(1, 1, 1, lanes=two),)))
    unequal = (two[0], lane(Step(Op.COPY, (ref(0, IN, 0),), (ref(0, OUT, 0),))))
    with pytest.raises(PlanError, match="different numbers of barriers"):
        check(Plan(Collective.ALL_REDUCE, 1, (RankProgram(1, 1, 1, lanes=unequal),)))


def test_semaphore_with_two_waiting_lanes_is_rejected():
    two = (lane(signal(0), wait()), lane(signal(0), wait()))
    with pytest.raises(PlanError, match="semaphore 0 is waited on by lanes"):
        check(Plan(Collective.ALL_REDUCE, 1, (RankProgram(1, 1, 0, 1, lanes=two),)))


def test_all_peers_signal_then_wait_n_times_orders_every_peer():
    # rank 0 reads every peer's scratch after N-1 waits on one semaphore signalled by all peers
    n = 4
    progs = [RankProgram(1, 1, 1, 1, lanes=(lane(*[wait() for _ in range(n - 1)], Step(
        Op.READ_REDUCE, (ref(0, IN, 0),) + tuple(ref(p, SCR, 0) for p in range(1, n)), (ref(0, OUT, 0),)),
        *[signal(p) for p in range(1, n)]),))]
    for r in range(1, n):
        progs.append(RankProgram(1, 1, 1, 1, lanes=(lane(
            Step(Op.COPY, (ref(r, IN, 0),), (ref(r, SCR, 0),)), signal(0), wait(),
            Step(Op.GET, (ref(0, OUT, 0),), (ref(r, OUT, 0),))),)))
    check(Plan(Collective.ALL_REDUCE, n, tuple(progs)))


def test_double_counted_contribution_names_output_and_extra():
    progs = tuple(RankProgram(1, 1, lanes=(lane(Step(Op.READ_REDUCE, (ref(0, IN, 0), ref(1, IN, 0), ref(1, IN, 0)),
                                                      (ref(r, OUT, 0),))),)) for r in range(2))
    with pytest.raises(PlanError, match=r"rank 0: output chunk 0 holds r0.in\[0\] \+ 2x r1.in\[0\], expected "
                                        r"r0.in\[0\] \+ r1.in\[0\] for all_reduce \(extra r1.in\[0\]\)"):
        check(Plan(Collective.ALL_REDUCE, 2, progs))


def test_wrong_block_in_all_gather_is_caught():
    p = two_rank_all_gather()
    steps = list(p.ranks[0].lanes[0].steps)
    steps[1] = put(ref(0, IN, 0), ref(1, OUT, 1))  # writes the wrong block of rank 1
    with pytest.raises(PlanError):
        check(replace_lane(p, 0, steps))


def test_reading_unwritten_chunk_is_reported():
    progs = (RankProgram(1, 1, 1, lanes=(lane(Step(Op.COPY, (ref(0, SCR, 0),), (ref(0, OUT, 0),))),)),)
    with pytest.raises(PlanError, match=r"rank 0, lane 0, step 0 .* reads r0.scratch\[0\], which holds no value"):
        check(Plan(Collective.ALL_REDUCE, 1, progs))


def test_broadcast_root_and_ppermute_perm_are_postconditions():
    p = builtin(Collective.BROADCAST, "direct", 4, root=2)
    check(p)
    with pytest.raises(PlanError, match=r"expected r1.in\[0\]"):
        check(dataclasses.replace(p, root=1))
    q = builtin(Collective.PPERMUTE, "direct", 4, perm=((0, 1), (1, 2)))
    check(q)
    with pytest.raises(PlanError, match="rank 3: output chunk 0 holds zeros, expected r2.in"):
        check(dataclasses.replace(q, perm=((0, 1), (1, 2), (2, 3))))


def test_custom_plan_needs_a_postcondition():
    progs = (RankProgram(1, 1, lanes=(lane(Step(Op.COPY, (ref(0, IN, 0),), (ref(0, OUT, 0),))),)),)
    plan = Plan(Collective.CUSTOM, 1, progs, in_blocks=1, out_blocks=1)
    with pytest.raises(PlanError, match="states no postcondition"):
        check(plan)
    check(plan, postcondition=lambda r, i: value([(r, i)]))


def test_in_place_all_gather_reads_input_at_output_block():
    # in-place: rank r's input is output block r, so writing peers' blocks is all there is to do
    progs = tuple(RankProgram(1, 2, lanes=(lane(put(ref(r, IN, 0), ref(1 - r, OUT, r))),)) for r in range(2))
    check(Plan(Collective.ALL_GATHER, 2, progs, in_place=True))
    with pytest.raises(PlanError, match="rank 0: output chunk 0 holds nothing"):
        check(Plan(Collective.ALL_GATHER, 2, progs, in_place=False))


def _synthesized():
    from jaxcoll.synth import hierarchical, rhd, ring, tree
    from jaxcoll.topology import presets
    out = []
    for topo_name, topo in (("dgx1", presets.dgx1()), ("cpu4", presets.cpu(4))):
        for c in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
            out += [(f"ring_{topo_name}_{c.value}", ring(topo, c)),
                    (f"rhd_{topo_name}_{c.value}", rhd(topo, c)),
                    (f"hier_{topo_name}_{c.value}", hierarchical(topo, c))]
        out.append((f"tree_{topo_name}", tree(topo, Collective.ALL_REDUCE)))
    return out


def test_every_synthesized_plan_is_proved_and_survives_msccl_round_trip():
    from jaxcoll.lang import load_msccl_xml, to_msccl_xml
    from jaxcoll.lang.check import execute, outputs
    for name, plan in _synthesized():
        check(plan)
        back = check(load_msccl_xml(to_msccl_xml(plan)))
        assert outputs(plan, execute(plan)) == outputs(back, execute(back)), name
