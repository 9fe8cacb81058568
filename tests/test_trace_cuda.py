"""jaxcoll.trace on the CUDA executor. Without a GPU: the host's conversion of a kernel's step times into trace
events (csrc/trace_steps.hpp, reached through the native module), checked against the plan read from the Plan
object: the layout (two times a step, rank by rank, lane by lane), the launched ranks only, steps never reached
left out, a step that never ended marked unfinished, the clock offset. On a GPU (the round's `jax` step): calls of
the emulated 8-rank harness traced, every step of every rank once per call, waits ending after their signals, and
calls captured into a CUDA graph left untraced."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

import jaxcoll
from jaxcoll import algorithms, runtime
from jaxcoll.observe import trace_events
from jaxcoll.plan import Collective, Op, encode
from jaxcoll.plan.ir import OP_CODES

from trace_checks import (assert_each_call_runs_the_plan_once, assert_trace_event_schema,
                          assert_waits_end_after_their_signals, steps_of)

native = runtime._jaxcoll
_usable, _why = runtime.cuda_status()
needs_gpu = pytest.mark.skipif(not _usable, reason=_why or "CUDA executor usable")
ITEM = 4  # float32


def ring(nranks: int = 4):
    return algorithms.select(Collective.ALL_REDUCE, nranks, 1024, np.float32, "ring")


def convert(plan, times, block, first_rank=0, launch_ranks=None, offset=0, read_ns=0, **who) -> np.ndarray:
    data = native.trace_device_steps(encode(plan), np.ascontiguousarray(times, np.uint64), "float32", block,
                                     first_rank, plan.nranks if launch_ranks is None else launch_ranks, offset,
                                     read_ns, **who)
    return np.frombuffer(data, dtype=trace_events.EVENT)


def layout(plan) -> dict:
    """(rank, lane, position) -> the step's number in the kernel's buffer: the plan's steps in order."""
    return {(r, l, i): n for n, (r, l, i, _) in enumerate(plan.steps())}


def test_step_times_become_one_event_a_step_with_the_plans_fields():
    plan = ring()
    block = 6 * plan.chunk_factor  # every chunk holds 6 elements
    where = layout(plan)
    times = np.zeros(2 * len(where), np.uint64)
    base, offset = 1_700_000_000_000_000_000, 1_600_000_000_000_000_000  # %globaltimer: ns since the epoch
    for n in range(len(where)):
        times[2 * n], times[2 * n + 1] = base + 100 * n, base + 100 * n + 40 + n
    events = convert(plan, times, block, offset=offset, callsite=7, group=1, call=3)
    assert len(events) == plan.num_steps()
    signaller = defaultdict(set)
    for r, _, _, s in plan.steps():
        if s.op is Op.SIGNAL:
            signaller[s.peer, s.sem].add(r)
    waits_so_far = defaultdict(int)
    want = {}
    for r, l, i, s in plan.steps():
        n = where[r, l, i]
        w = {"op": OP_CODES[s.op], "start_ns": base + 100 * n - offset, "end_ns": base + 100 * n + 40 + n - offset,
             "flags": 0, "bytes": 0, "peer": -1, "sem": -1, "count": 0}
        if s.op is Op.SIGNAL:
            w.update(peer=s.peer, sem=s.sem, count=1)
        elif s.op is Op.WAIT:
            waits_so_far[r, s.sem] += 1
            who = signaller[r, s.sem]
            w.update(peer=next(iter(who)) if len(who) == 1 else -2, sem=s.sem, count=waits_so_far[r, s.sem])
        elif s.op.is_data:
            others = [ref.rank for ref in s.srcs + s.dsts if ref.rank != r]
            w.update(bytes=s.dsts[0].count * 6 * ITEM, peer=others[0] if others else -1)
        want[r, l, i] = w
    for e in events:
        assert (e["callsite"], e["group"], e["call"]) == (7, 1, 3)
        w = want.pop((int(e["rank"]), int(e["lane"]), int(e["step"])))
        assert {k: int(e[k]) for k in w} == w
    assert not want


def test_only_the_launched_ranks_and_the_steps_reached_are_events():
    plan = ring()
    where = layout(plan)
    times = np.zeros(2 * len(where), np.uint64)
    started, ended = {}, {}
    for (r, l, i), n in where.items():
        if i < 2:  # every lane ran its first two steps, and started its third without ending it
            times[2 * n], times[2 * n + 1] = 1000 + n, 2000 + n
            ended[r, l, i] = 2000 + n
        elif i == 2:
            times[2 * n] = 1000 + n
            started[r, l, i] = 1000 + n
    events = convert(plan, times, 6 * plan.chunk_factor, first_rank=1, launch_ranks=2, read_ns=5000)
    got = {(int(e["rank"]), int(e["lane"]), int(e["step"])): e for e in events}
    assert set(got) == {k for k in list(started) + list(ended) if k[0] in (1, 2)}
    for k, e in got.items():
        if k in ended:
            assert (e["end_ns"], e["flags"]) == (ended[k], 0)
        else:  # unfinished: it ends when the host read the times
            assert (e["start_ns"], e["end_ns"], e["flags"]) == (started[k], 5000, 1)


def test_the_times_must_cover_every_step_of_the_plan():
    plan = ring()
    with pytest.raises(ValueError, match="two uint64 for each step"):
        convert(plan, np.zeros(2 * plan.num_steps() - 2, np.uint64), 6)


def test_the_globaltimer_offset_is_the_wall_clock_minus_the_monotonic_clock():
    # The difference of the two clocks does not depend on when it is read (short of a clock step), so reading it
    # on both sides of the native call bounds the native one with no assumption about timing.
    mono_a, real_a = native.trace_clock_ns()
    offset = native.trace_globaltimer_offset_ns()
    mono_b, real_b = native.trace_clock_ns()
    lo, hi = sorted((real_a - mono_a, real_b - mono_b))
    assert lo - 1_000_000 <= offset <= hi + 1_000_000


def test_converted_events_make_a_trace_file_of_the_cpu_executors_schema(tmp_path):
    plan = ring()
    times = np.zeros(2 * plan.num_steps(), np.uint64)
    times[0::2] = np.arange(plan.num_steps(), dtype=np.uint64) * 10 + 10**9
    times[1::2] = times[0::2] + 5
    events = convert(plan, times, 6 * plan.chunk_factor, offset=10**8)
    path = tmp_path / "t.json"
    trace_events.write(path, events, {"clock": "CLOCK_MONOTONIC"})
    doc = json.loads(path.read_text())
    assert_trace_event_schema(doc)
    assert_each_call_runs_the_plan_once(steps_of(doc), plan, calls=1)


@needs_gpu
@pytest.mark.parametrize("name, protocol, blocks", [("ring", "bulk", 1), ("ring", "bulk", 2), ("two_shot", "ll", 0)])
def test_traced_calls_of_the_emulated_8_rank_harness(tmp_path, name, protocol, blocks):
    plan = algorithms.select(Collective.ALL_REDUCE, 8, 1024, np.float32, name)
    inputs = [np.arange(64 * plan.in_blocks, dtype=np.float32) + r for r in range(8)]
    path = tmp_path / "t.json"
    with jaxcoll.trace(path):
        outs = runtime.run_plan_cuda(plan, inputs, timeout_s=30.0, protocol=protocol, blocks_per_lane=blocks,
                                     calls=3)
    for y in outs:
        np.testing.assert_array_equal(y, np.sum(inputs, axis=0))
    doc = json.loads(path.read_text())
    assert_trace_event_schema(doc)
    events = steps_of(doc)
    assert_each_call_runs_the_plan_once(events, plan, calls=3)
    assert_waits_end_after_their_signals(events)
    assert all(e["dur"] >= 0 and not e["args"].get("unfinished") for e in events)


@needs_gpu
def test_calls_captured_into_a_cuda_graph_are_not_traced(tmp_path):
    plan = ring(8)
    path = tmp_path / "t.json"
    with jaxcoll.trace(path):  # one call to warm up, then three captured into a graph and replayed twice
        native.cuda_time(encode(plan), "float32", 64 * plan.in_blocks, 64 * plan.in_blocks, iters=3, graph=True)
    events = steps_of(json.loads(path.read_text()))
    assert_each_call_runs_the_plan_once(events, plan, calls=1)
