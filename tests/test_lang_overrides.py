"""Per-operation overrides of the compiler's lane, channel and semaphore assignment (`copy(..., channel=,
sem=)`, `reduce(..., channel=, sem=)`): the passes honour them and assign the rest around them, the checker
rejects overrides that make a plan unsafe, naming rank, lane and step, and the file formats carry them."""

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from jaxcoll.lang import PlanError, check, chunk, load_msccl_xml, program, to_msccl_xml, to_mscclpp_json
from jaxcoll.lang.compiler import Instr, assign_channels, assign_lanes, insert_sync, replicate
from jaxcoll.plan import Buffer, Lane, Op, Plan, RankProgram, Step, decode, encode
from test_lang_passes import SPACE, put, ref

IN, OUT, SCR = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH


def ring_all_reduce(n, channels):
    """Ring all-reduce with chunk c on channel c % channels, like msccl-tools' allreduce_a100_ring."""
    with program(f"ring_{channels}ch", "all_reduce", n, chunks=n) as p:
        for c in range(n):
            cur = chunk((c + 1) % n, "input", c)
            for hop in range(1, n):
                r = (c + 1 + hop) % n
                cur = cur.copy(r, "acc", c, channel=c % channels).reduce(chunk(r, "input", c))
            cur = cur.copy(c, "output", c)  # local: a channel would be an error
            for hop in range(1, n):
                cur = cur.copy((c + hop) % n, "output", c, channel=c % channels)
    return p.plan()


def stage_inputs(n):
    """Inside a program: every rank puts its input into block q (its rank) of each rank's staging buffer."""
    for q in range(n):
        for r in range(n):
            chunk(q, "input", 0).copy(r, "stage", q)


def gather_then_copy(n, sem):
    """All-gather: every rank puts its input into each peer's staging buffer, then each rank copies the staged
    blocks to its output in one step, which depends on all N-1 peers' puts (sem=: one shared semaphore)."""
    with program("staged_all_gather", "all_gather", n) as p:
        stage_inputs(n)
        for r in range(n):
            chunk(r, "stage", 0, n).copy(r, "output", 0, sem=sem)
    return p.plan()


def channels_to(plan, rank, peer):
    return {s.channel for s in (st for r, _, _, st in plan.steps() if r == rank)
            if any(x.rank == peer for x in s.dsts + s.srcs)}


# -- channels ---------------------------------------------------------------------------------------------------
def test_channel_override_is_carried_to_every_step_of_the_operation():
    plan = ring_all_reduce(4, 2)
    for r in range(4):
        assert channels_to(plan, r, (r + 1) % 4) == {0, 1}
    # channels of one pair run on lanes of their own
    for r in range(4):
        by_lane = {}
        for rr, l, _, st in plan.steps():
            if rr == r and st.channel >= 0:
                by_lane.setdefault(st.channel, set()).add(l)
        assert all(len(lanes) == 1 for lanes in by_lane.values()) and by_lane[0] != by_lane[1]


def test_plan_over_two_channels_computes_the_sum():
    runtime = pytest.importorskip("jaxcoll.runtime", exc_type=ImportError)
    plan = ring_all_reduce(4, 2)
    xs = [np.random.default_rng(r).integers(-9, 9, 19).astype(np.float32) for r in range(4)]
    for got in runtime.run_plan(plan, xs):
        np.testing.assert_array_equal(got, np.sum(xs, axis=0))


def test_automatic_channels_give_each_lane_its_own_channel_around_the_pinned_ones():
    a, b = ref(0, IN, 0), ref(0, IN, 1)
    instrs = [Instr(0, Step(Op.PUT, (a,), (ref(1, OUT, 0),)), lane=0),
              Instr(0, Step(Op.PUT, (b,), (ref(1, OUT, 1),)), lane=1, channel=0),
              Instr(0, Step(Op.COPY, (a,), (ref(0, OUT, 0),)), lane=0),
              Instr(0, Step(Op.PUT, (b,), (ref(1, SCR, 0),)), lane=0)]
    got = assign_channels(instrs)
    assert [i.step.channel for i in got] == [1, 0, -1, 1]  # lane 1 pinned channel 0; local copies name none


def test_operations_on_different_channels_get_different_automatic_lanes():
    i0 = put(ref(0, IN, 0), ref(1, OUT, 0))
    i1 = Instr(0, i0.step, channel=1)
    i2 = Instr(0, i0.step, lane=0)  # pinned lane 0: automatic lanes are numbered around it
    assert [i.lane for i in assign_lanes([i2, i0, i1])] == [0, 1, 2]


def test_replicas_spread_pinned_channels_and_semaphores():
    i = Instr(0, Step(Op.PUT, (ref(0, IN, 0),), (ref(1, OUT, 0),)), channel=1, sem=2)
    got = replicate([i], 3)
    assert [(x.channel, x.sem, x.instance) for x in got] == [(3, 6, 0), (4, 7, 1), (5, 8, 2)]


def test_channel_on_a_local_operation_is_an_error():
    with program("p", "all_reduce", 2):
        with pytest.raises(PlanError, match=r"channel=1 on a local operation of rank 0"):
            chunk(0, "input", 0).copy(0, "output", 0, channel=1)
        with pytest.raises(PlanError, match=r"channel=-1, expected an integer >= 0"):
            chunk(0, "input", 0).copy(1, "output", 0, channel=-1)
        with pytest.raises(PlanError, match=r"sem='a', expected an integer >= 0"):
            chunk(0, "input", 0).copy(1, "output", 0, sem="a")


def test_one_channel_driven_from_two_lanes_is_rejected():
    with program("p", "all_gather", 2) as p:
        chunk(0, "input", 0).copy(0, "output", 0)
        chunk(1, "input", 0).copy(1, "output", 1)
        chunk(0, "input", 0).copy(1, "output", 0, lane=0, channel=0)
        chunk(1, "input", 0).copy(0, "scratch", 0, lane=0)
        chunk(0, "scratch", 0).copy(1, "scratch", 0, lane=1, channel=0)
        chunk(0, "scratch", 0).copy(0, "output", 1)
    with pytest.raises(PlanError, match=r"rank 0, lane 1, step \d+ \(put\(.*@ch0\)\): uses channel 0 to rank 1, "
                                        r"which rank 0, lane 0, step \d+ .* drives from another lane"):
        p.plan()


def test_channels_survive_the_plan_file_but_not_the_wire_form(tmp_path):
    plan = ring_all_reduce(4, 2)
    plan.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json") == plan
    wire = decode(encode(plan))
    assert {s.channel for _, _, _, s in wire.steps()} == {-1}
    assert [s.op for _, _, _, s in wire.steps()] == [s.op for _, _, _, s in plan.steps()]


def test_channels_go_to_msccl_xml_tbs_and_come_back():
    plan = ring_all_reduce(4, 2)
    root = ET.fromstring(to_msccl_xml(plan))
    assert root.get("nchannels") == "2"
    for g in root.findall("gpu"):
        me = int(g.get("id"))
        sends = {(int(tb.get("send")), int(tb.get("chan"))) for tb in g.findall("tb") if tb.get("send") != "-1"}
        recvs = {(int(tb.get("recv")), int(tb.get("chan"))) for tb in g.findall("tb") if tb.get("recv") != "-1"}
        assert sends == {((me + 1) % 4, 0), ((me + 1) % 4, 1)}
        assert recvs == {((me - 1) % 4, 0), ((me - 1) % 4, 1)}
    back = check(load_msccl_xml(ET.tostring(root, encoding="unicode")))
    for r in range(4):
        assert channels_to(back, r, (r + 1) % 4) == {0, 1}


def test_channels_become_distinct_mscclpp_memory_channels():
    plan = ring_all_reduce(4, 2)
    doc = json.loads(to_mscclpp_json(plan))
    for g in doc["gpus"]:
        me = g["id"]
        connected = g["channels"][0]["connected_to"]
        used = {}
        for tb in g["threadblocks"]:
            for op in tb["ops"]:
                if op["name"] in ("put", "rs", "rrcs", "rrc", "get") and "channel_ids" in op:
                    for c in op["channel_ids"]:
                        used.setdefault(connected[c], set()).add(c)
        # the data of each neighbour pair travels over two memory channels, one per plan channel
        assert len(used[(me + 1) % 4]) == 2


# -- semaphores --------------------------------------------------------------------------------------------------
def test_shared_semaphore_replaces_one_per_signalling_lane():
    auto, shared = gather_then_copy(4, None), gather_then_copy(4, 0)
    assert [p.semaphores for p in auto.ranks] == [3] * 4
    assert [p.semaphores for p in shared.ranks] == [1] * 4
    waits = [(r, s.sem) for r, _, _, s in shared.steps() if s.op is Op.WAIT]
    assert sorted(waits) == [(r, 0) for r in range(4) for _ in range(3)]


def test_shared_semaphore_plan_gathers():
    runtime = pytest.importorskip("jaxcoll.runtime", exc_type=ImportError)
    plan = gather_then_copy(4, 0)
    xs = [np.arange(5, dtype=np.float32) + 10 * r for r in range(4)]
    for got in runtime.run_plan(plan, xs):
        np.testing.assert_array_equal(got, np.concatenate(xs))


def test_pinned_semaphore_is_honoured_and_automatic_ones_go_around_it():
    with program("p", "all_gather", 3) as p:
        stage_inputs(3)
        for r in range(3):
            chunk(r, "stage", 1).copy(r, "output", 1, lane=0, sem=0)   # waits for rank 1: pinned sem 0
            chunk(r, "stage", 0).copy(r, "output", 0, lane=1)          # waits for rank 0: automatic
            chunk(r, "stage", 2).copy(r, "output", 2, lane=1)          # waits for rank 2: automatic
    plan = p.plan()
    for r in range(3):
        lanes = plan.ranks[r].lanes
        assert {s.sem for s in lanes[0].steps if s.op is Op.WAIT} <= {0}
        assert 0 not in {s.sem for s in lanes[1].steps if s.op is Op.WAIT}


def test_semaphore_pinned_on_two_lanes_is_rejected():
    with program("p", "all_gather", 3) as p:
        stage_inputs(3)
        for r in range(3):
            chunk(r, "stage", 0).copy(r, "output", 0, lane=0, sem=0)
            chunk(r, "stage", 1).copy(r, "output", 1, lane=1, sem=0)
            chunk(r, "stage", 2).copy(r, "output", 2, lane=1)
    with pytest.raises(PlanError, match=r"rank 0, lane 1, step \d+ \(wait\(sem0\)\): semaphore 0 is waited on by "
                                        r"lanes \[0, 1\] of rank 0 \(also by rank 0, lane 0, step \d+"):
        p.plan()


def test_shared_semaphore_whose_waits_can_take_the_wrong_signal_is_a_race():
    # rank 2 waits once on sem 0 for rank 0's put, then once for rank 1's; rank 1's signal may come first,
    # so the first copy could read a chunk rank 0 has not written yet
    with program("p", "all_gather", 3) as p:
        stage_inputs(3)
        for r in range(3):
            for q in range(3):
                chunk(r, "stage", q).copy(r, "output", q, lane=0, sem=0)
    with pytest.raises(PlanError, match=r"race on r\d\.scratch\[\d\]: rank \d, lane \d, step \d+ \((copy|put)\(.*\)\) "
                                        r"writes it and rank \d, lane 0, step \d+ \(copy\(.*\)\) reads it"):
        p.plan()


def test_a_wait_left_without_its_signal_names_rank_lane_and_step():
    plan = gather_then_copy(3, 0)
    r0 = plan.ranks[0]
    # drop rank 0's first signal to rank 1's shared semaphore
    lanes = list(r0.lanes)
    for l, lane in enumerate(lanes):
        steps = list(lane.steps)
        hit = [i for i, s in enumerate(steps) if s.op is Op.SIGNAL and s.peer == 1]
        if hit:
            del steps[hit[0]]
            lanes[l] = Lane(tuple(steps))
            break
    bad = Plan(plan.collective, plan.nranks, (RankProgram(r0.input_chunks, r0.output_chunks, r0.scratch_chunks,
                                                          r0.semaphores, tuple(lanes)),) + plan.ranks[1:])
    with pytest.raises(PlanError, match=r"rank 1, lane \d, step \d+ \(wait\(sem0\)\): wait number 2 on semaphore "
                                        r"0 of rank 1 has no matching signal"):
        check(bad)


def test_semaphore_override_in_mscclpp_json_names_the_pinned_semaphore_channel():
    # one signalling peer per semaphore: rank 1 waits on its pinned semaphore 3 for rank 0's puts
    with program("p", "all_gather", 2) as p:
        chunk(0, "input", 0).copy(1, "stage", 0, lane=0)
        chunk(1, "input", 0).copy(1, "stage", 1, lane=2)  # same lane as its reader: no signal
        chunk(1, "stage", 0, 2).copy(1, "output", 0, lane=2, sem=3)
        chunk(0, "input", 0).copy(0, "output", 0)
        chunk(1, "input", 0).copy(0, "output", 1)
    plan = p.plan()
    assert plan.ranks[1].semaphores == 4
    assert {s.sem for s in plan.ranks[1].lanes[2].steps if s.op is Op.WAIT} == {3}
    doc = json.loads(to_mscclpp_json(plan))
    g0, g1 = doc["gpus"]
    sig = [op for tb in g0["threadblocks"] for op in tb["ops"] if op["name"] == "signal"]
    wait = [op for tb in g1["threadblocks"] for op in tb["ops"] if op["name"] == "wait"]
    assert sig and wait
    # the i-th channel of 0 towards 1 meets the i-th of 1 towards 0: signal and wait name the same one
    assert {c for op in sig for c in op["channel_ids"]} == {c for op in wait for c in op["channel_ids"]}
    assert {g0["channels"][0]["connected_to"][c] for op in sig for c in op["channel_ids"]} == {1}


def test_insert_sync_puts_pinned_signals_on_the_pinned_semaphore():
    a = put(ref(0, IN, 0), ref(1, SCR, 0))
    b = put(ref(2, IN, 0), ref(1, SCR, 1))
    use_a = Instr(1, Step(Op.COPY, (ref(1, SCR, 0),), (ref(1, OUT, 0),)), lane=0, sem=5)
    use_b = Instr(1, Step(Op.COPY, (ref(1, SCR, 1),), (ref(1, OUT, 1),)), lane=0)
    instrs = [Instr(0, a.step, lane=0), Instr(2, b.step, lane=0), use_a, use_b]
    lanes, sems = insert_sync(instrs, [set(), set(), {0}, {1}], SPACE, 3)
    assert sems == [0, 6, 0]
    assert [s.sem for s in lanes[0][0] if s.op is Op.SIGNAL] == [5]
    assert [s.sem for s in lanes[2][0] if s.op is Op.SIGNAL] == [0]
    assert [s.sem for s in lanes[1][0] if s.op is Op.WAIT] == [5, 0]


def test_override_plans_are_proved_at_every_size():
    for n in (2, 3, 5, 8):
        check(gather_then_copy(n, 0))
        check(ring_all_reduce(n, 3))
