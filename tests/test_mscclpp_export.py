"""MSCCL++ JSON export of semaphores that several ranks signal ("every peer signals, then wait for all of
them", `sem=`): each MSCCL++ wait names the channels whose signals the plan proves it consumes, the file reads
back consistently (every signal meets a wait on the peer's end of the same channel), an interpreter of the file
under random schedules computes the collective, and waits whose signals the plan does not fix are a PlanError.

The interpreter models the executor (src/core/include/execution_kernel.hpp) on the one stepper of semaphores
and barriers (`jaxcoll.lang.stepper`): a `wait` op has one thread per listed channel, each consuming the next
signal of its channel; `sem_acquire` likewise per device semaphore; the i-th memory channel of gpu a towards b
is the i-th of b towards a."""

import json
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcoll.lang import PlanError, check, chunk, program, stepper, to_mscclpp_json
from jaxcoll.lang.postcondition import expected
from jaxcoll.lang.stepper import Stepper, Sync
from jaxcoll.plan import Collective, Op, Plan, RankProgram, Step
from test_checker_hypothesis import SETTINGS, programs
from test_lang_overrides import gather_then_copy
from test_lang_plans import IN, OUT, SCR, lane, ref, signal, wait
DATA = {"copy", "put", "get", "re", "rrc", "rs", "rrcs"}


def peer_channel(doc):
    """(gpu, channel id) -> (peer, the peer's channel id for the same channel)."""
    conn = {g["id"]: (g["channels"][0]["connected_to"] if g["channels"] else []) for g in doc["gpus"]}
    out = {}
    for g, peers in conn.items():
        for c, p in enumerate(peers):
            nth = sum(1 for q in peers[:c] if q == p)
            out[g, c] = (p, [i for i, q in enumerate(conn[p]) if q == g][nth])
    return out


def ops(doc, gpu, name):
    return [op for tb in doc["gpus"][gpu]["threadblocks"] for op in tb["ops"] if op["name"] == name]


def assert_signals_meet_waits(doc):
    """Every signal goes over a channel whose other end waits on it as often as it is signalled, and no
    operation lists a channel or semaphore twice (one thread each) or more than the executor holds."""
    pair = peer_channel(doc)
    sent, waited = Counter(), Counter()
    for g in doc["gpus"]:
        for tb in g["threadblocks"]:
            for op in tb["ops"]:
                ids = op.get("channel_ids", op.get("semaphore_ids", []))
                if op["name"] in ("signal", "wait", "sem_acquire", "sem_release"):
                    assert len(ids) == len(set(ids)) and len(ids) <= 8, op
                if op["name"] == "signal":
                    sent.update(pair[g["id"], c] for c in ids)
                elif op["name"] == "wait":
                    waited.update((g["id"], c) for c in ids)
                elif op["name"] == "sem_release":
                    sent.update(("sem", g["id"], s) for s in ids)
                elif op["name"] == "sem_acquire":
                    waited.update(("sem", g["id"], s) for s in ids)
    assert sent == waited


def interpret(doc, nchunks, seed):
    """Run the file on symbolic values (input chunk i of rank r is {(r, i): 1}) picking a random runnable
    threadblock at each op; return {(rank, output index): value}. Raises AssertionError on deadlock."""
    pair = peer_channel(doc)
    rng = random.Random(seed)
    mem = {(g, "i", i): Counter({(g, i): 1}) for g in range(len(doc["gpus"])) for i in range(nchunks[g][0])}
    threadblocks = {(g["id"], tb["id"]): tb["ops"] for g in doc["gpus"] for tb in g["threadblocks"]}

    def sync(key, op):
        # semaphores: (gpu, channel) for a channel's signals arriving at gpu, ("sem", gpu, id) for its own
        g, name = key[0], op["name"]
        if name == "signal":
            return Sync(signals=[pair[g, c] for c in op["channel_ids"]])
        if name == "wait":
            return Sync(waits=[(g, c) for c in op["channel_ids"]])
        if name == "sem_release":
            return Sync(signals=[("sem", g, s) for s in op["semaphore_ids"]])
        if name == "sem_acquire":
            return Sync(waits=[("sem", g, s) for s in op["semaphore_ids"]])
        if name == "barrier":
            return Sync(barrier=g, parties=op["num_threadblocks"])
        assert name in DATA, name
        return stepper.DATA

    def loc(g, b):
        if "buffer_id" in b:
            rb = doc["gpus"][g]["remote_buffers"][b["buffer_id"]]
            return rb["rank"], rb["type"]
        return g, b["type"]

    run = Stepper(threadblocks, sync)
    while live := [key for key, _ in run.unfinished()]:
        ready = [key for key in live if not run.blocked(key)]
        assert ready, f"deadlock at {run.unfinished()}"
        key = rng.choice(ready)
        if run.next_sync(key) is stepper.DATA:
            g, op = key[0], threadblocks[key][run.pc[key]]
            for j in range(op["src_buff"][0]["size"]):
                v = Counter()
                for b in op["src_buff"]:
                    v += mem.get(loc(g, b) + (b["index"] + j,), Counter({"unwritten": 1}))
                for b in op["dst_buff"]:
                    mem[loc(g, b) + (b["index"] + j,)] = v
        run.step(key)
    return {(g, i): mem.get((g, "o", i)) for g in range(len(doc["gpus"])) for i in range(nchunks[g][1])}


def assert_computes(doc, plan, seeds=range(20)):
    """The file computes the plan's collective (its postcondition, not the plan's steps) in every schedule."""
    want = expected(plan, None)
    sizes = [(g["input_chunks"], g["output_chunks"]) for g in doc["gpus"]]
    for seed in seeds:
        for (r, i), got in interpret(doc, sizes, seed).items():
            assert want(r, i) is None or got == want(r, i), (seed, r, i, got)


# -- a semaphore signalled by every peer ------------------------------------------------------------------------
def test_shared_semaphore_of_three_peers_becomes_one_wait_over_their_three_channels():
    plan = gather_then_copy(4, 0)
    doc = json.loads(to_mscclpp_json(plan))
    pair = peer_channel(doc)
    for g in range(4):
        conn = doc["gpus"][g]["channels"][0]["connected_to"]
        (wait,) = ops(doc, g, "wait")
        assert sorted(conn[c] for c in wait["channel_ids"]) == sorted({0, 1, 2, 3} - {g})
        # each listed channel is the one the peer signals on
        for c in wait["channel_ids"]:
            p, theirs = pair[g, c]
            assert [theirs] in [op["channel_ids"] for op in ops(doc, p, "signal")]
        # the wait comes before the copy out of staging, on the same threadblock
        (tb,) = [tb for tb in doc["gpus"][g]["threadblocks"] if wait in tb["ops"]]
        names = [op["name"] for op in tb["ops"]]
        assert names.index("wait") < len(names) - 1 and names[-1] == "copy"
    assert_signals_meet_waits(doc)
    assert_computes(doc, plan)


def test_more_signalling_peers_than_an_operation_holds_split_into_several_waits():
    plan = gather_then_copy(10, 0)
    doc = json.loads(to_mscclpp_json(plan))
    for g in range(10):
        waits = ops(doc, g, "wait")
        assert [len(op["channel_ids"]) for op in waits] == [8, 1]
    assert_signals_meet_waits(doc)
    assert_computes(doc, plan, seeds=range(3))


@settings(SETTINGS, max_examples=15)
@given(n=st.integers(2, 6), shared=st.lists(st.booleans(), min_size=6, max_size=6), seed=st.integers(0, 2 ** 16))
def test_staged_gathers_export_to_files_that_gather_under_any_schedule(n, shared, seed):
    # rank r's copy out of staging waits on one shared semaphore if shared[r], else one per signalling lane
    with program("staged", "all_gather", n) as p:
        for q in range(n):
            for r in range(n):
                chunk(q, "input", 0).copy(r, "stage", q)
        for r in range(n):
            chunk(r, "stage", 0, n).copy(r, "output", 0, sem=0 if shared[r] else None)
    plan = p.plan()
    doc = json.loads(to_mscclpp_json(plan))
    assert_signals_meet_waits(doc)
    assert_computes(doc, plan, seeds=[seed])


@SETTINGS
@given(programs(), st.integers(0, 2 ** 16))
def test_generated_plans_export_to_consistent_files(plan, seed):
    doc = json.loads(to_mscclpp_json(plan))
    assert_signals_meet_waits(doc)
    assert_computes(doc, plan, seeds=[seed])


# -- waits on different steps ------------------------------------------------------------------------------------
def cp(op, a, b):
    return Step(op, (a,), (b,))


def chained_all_gather(ordered):
    """All-gather of 3 where rank 0 waits once on semaphore 0 for rank 1's block, copies it out, then waits
    again for rank 2's. `ordered`: rank 2 sends only after rank 0 signalled it (so after rank 0's first wait),
    which fixes the first wait's signal; otherwise both signals race for it and rank 0 reads neither block
    (the blocks land in its output directly), so the plan is still safe."""
    if ordered:
        r0 = (cp(Op.COPY, ref(0, IN, 0), ref(0, OUT, 0)), wait(), cp(Op.COPY, ref(0, SCR, 0), ref(0, OUT, 1)),
              cp(Op.PUT, ref(0, IN, 0), ref(2, OUT, 0)), signal(2), cp(Op.PUT, ref(0, IN, 0), ref(1, OUT, 0)),
              wait(), cp(Op.COPY, ref(0, SCR, 1), ref(0, OUT, 2)))
        r1 = (cp(Op.PUT, ref(1, IN, 0), ref(0, SCR, 0)), signal(0), cp(Op.COPY, ref(1, IN, 0), ref(1, OUT, 1)),
              cp(Op.PUT, ref(1, IN, 0), ref(2, OUT, 1)))
        r2 = (cp(Op.COPY, ref(2, IN, 0), ref(2, OUT, 2)), wait(), cp(Op.PUT, ref(2, IN, 0), ref(0, SCR, 1)),
              signal(0), cp(Op.PUT, ref(2, IN, 0), ref(1, OUT, 2)))
        sems = (1, 0, 1)
    else:
        r0 = (wait(), cp(Op.COPY, ref(0, IN, 0), ref(0, OUT, 0)), cp(Op.PUT, ref(0, IN, 0), ref(1, OUT, 0)),
              cp(Op.PUT, ref(0, IN, 0), ref(2, OUT, 0)), wait())
        r1 = (cp(Op.PUT, ref(1, IN, 0), ref(0, OUT, 1)), signal(0), cp(Op.COPY, ref(1, IN, 0), ref(1, OUT, 1)),
              cp(Op.PUT, ref(1, IN, 0), ref(2, OUT, 1)))
        r2 = (cp(Op.PUT, ref(2, IN, 0), ref(0, OUT, 2)), signal(0), cp(Op.COPY, ref(2, IN, 0), ref(2, OUT, 2)),
              cp(Op.PUT, ref(2, IN, 0), ref(1, OUT, 2)))
        sems = (1, 0, 0)
    progs = tuple(RankProgram(1, 3, 2 if r == 0 else 0, sems[r], (lane(*steps),))
                  for r, steps in enumerate((r0, r1, r2)))
    return check(Plan(Collective.ALL_GATHER, 3, progs, name=f"chained_{ordered}"))


def test_waits_on_different_steps_whose_signals_are_ordered_name_one_channel_each():
    plan = chained_all_gather(ordered=True)
    doc = json.loads(to_mscclpp_json(plan))
    conn = doc["gpus"][0]["channels"][0]["connected_to"]
    assert [[conn[c] for c in op["channel_ids"]] for op in ops(doc, 0, "wait")] == [[1], [2]]
    assert_signals_meet_waits(doc)
    assert_computes(doc, plan)


def test_waits_on_different_steps_whose_signals_race_are_a_plan_error():
    plan = chained_all_gather(ordered=False)
    with pytest.raises(PlanError, match=r"rank 0, lane 0, step 0 \(wait\(sem0\)\): which signals on semaphore 0 of "
                                        r"rank 0 this wait consumes is not fixed: 1 waits up to rank 0, lane 0, "
                                        r"step 0 .* but only 0 signals are sure to have arrived"):
        to_mscclpp_json(plan)


def test_shared_semaphore_signalled_by_a_peer_and_a_local_lane_waits_on_a_channel_and_a_device_semaphore():
    # rank 0's lane 1 stages its own block and signals semaphore 0, as rank 1 does after its put
    r0 = (lane(wait(), wait(), Step(Op.COPY, (ref(0, SCR, 0, 2),), (ref(0, OUT, 0, 2),))),
          lane(cp(Op.COPY, ref(0, IN, 0), ref(0, SCR, 0)), signal(0), cp(Op.PUT, ref(0, IN, 0), ref(1, OUT, 0))))
    r1 = (lane(cp(Op.PUT, ref(1, IN, 0), ref(0, SCR, 1)), signal(0), cp(Op.COPY, ref(1, IN, 0), ref(1, OUT, 1))),)
    plan = check(Plan(Collective.ALL_GATHER, 2, (RankProgram(1, 2, 2, 1, r0), RankProgram(1, 2, 0, 0, r1))))
    doc = json.loads(to_mscclpp_json(plan))
    tb = doc["gpus"][0]["threadblocks"][0]["ops"]
    assert [op["name"] for op in tb] == ["sem_acquire", "wait", "copy"]
    assert doc["gpus"][0]["channels"][0]["connected_to"][tb[1]["channel_ids"][0]] == 1
    assert_signals_meet_waits(doc)
    assert_computes(doc, plan)
