"""jaxcoll.trace: every step of every rank appears once per call, as the plan (read from the Plan object) lists
it; a wait ends after the signal it consumed; data steps carry their bytes; the file is trace-event JSON; a failed
call's steps up to the failure are written; JAXCOLL_TRACE traces a whole run; a job of two processes writes one
file per process; `jaxcoll trace show` summarises and draws."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxcoll
from jaxcoll import algorithms, runtime
from jaxcoll.launch import launch
from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step
from trace_checks import (arrivals_of, assert_each_call_runs_the_plan_once, assert_trace_event_schema,
                          assert_waits_end_after_their_signals, by_call, load, steps_of)

MESH = jax.make_mesh((8,), ("i",))
HERE = Path(__file__).resolve().parent
ITEM = 4  # float32


def sharded(x):
    return jax.device_put(x, NamedSharding(MESH, P("i")))


def plan_of(collective: Collective, name: str, nranks: int = 8) -> Plan:
    return algorithms.select(collective, nranks, 1024, np.float32, name)


@pytest.mark.parametrize("collective, name, nranks", [(Collective.ALL_REDUCE, "two_shot", 4),
                                                      (Collective.ALL_REDUCE, "ring", 4),
                                                      (Collective.ALL_GATHER, "ring", 3),
                                                      (Collective.REDUCE_SCATTER, "direct", 5)])
def test_each_step_of_each_rank_appears_once_per_call_with_its_bytes(tmp_path, collective, name, nranks):
    plan = plan_of(collective, name, nranks)
    block = 6 * plan.chunk_factor  # elements of a block: every chunk holds 6
    inputs = [np.arange(block * plan.in_blocks, dtype=np.float32) + r for r in range(nranks)]
    path = tmp_path / "t.json"
    with jaxcoll.trace(path):
        for _ in range(3):
            runtime.run_plan(plan, inputs)
    doc = load(path)
    assert_trace_event_schema(doc)
    events = steps_of(doc)
    assert_each_call_runs_the_plan_once(events, plan, calls=3)
    assert_waits_end_after_their_signals(events)
    ops = {(r, l, i): s for r, l, i, s in plan.steps()}
    for e in events:
        s = ops[e["pid"], e["tid"], e["args"]["step"]]
        assert e["cat"] == "run_plan"
        if s.op.is_data:
            dst = s.dsts[0]
            assert e["args"]["bytes"] == dst.count * 6 * ITEM
            others = [ref.rank for ref in s.srcs + s.dsts if ref.rank != e["pid"]]
            assert e["args"].get("peer") == (others[0] if others else None)
        elif s.op is Op.SIGNAL:
            assert (e["args"]["to"], e["args"]["sem"]) == (s.peer, s.sem)


def test_a_wait_names_the_rank_whose_plan_signals_it(tmp_path):
    plan = plan_of(Collective.ALL_REDUCE, "ring", 4)
    signaller = {}
    for r, _, _, s in plan.steps():
        if s.op is Op.SIGNAL:
            signaller.setdefault((s.peer, s.sem), set()).add(r)
    with jaxcoll.trace(tmp_path / "t.json"):
        runtime.run_plan(plan, [np.ones(8 * plan.chunk_factor, np.float32)] * 4)
    waits = [e for e in steps_of(load(tmp_path / "t.json")) if e["name"] == "wait"]
    assert len(waits) == sum(s.op is Op.WAIT for *_, s in plan.steps())
    for e in waits:
        who = signaller[e["pid"], e["args"]["sem"]]
        assert e["args"]["from"] == (next(iter(who)) if len(who) == 1 else "several ranks")


def test_a_jit_program_traces_every_step_of_each_call(tmp_path):
    plan = plan_of(Collective.ALL_REDUCE, "ring")
    f = jax.jit(jax.shard_map(lambda x: jaxcoll.all_reduce(x, "i", algorithm=plan), mesh=MESH, in_specs=P("i"),
                              out_specs=P("i")))
    x = sharded(jnp.arange(8 * 256, dtype=jnp.float32))
    jax.block_until_ready(f(x))  # compiled and run once before the trace: only the traced calls count
    with jaxcoll.trace(tmp_path / "t.json"):
        for _ in range(2):
            y = jax.block_until_ready(f(x))
    np.testing.assert_array_equal(np.asarray(y), np.tile(np.asarray(x).reshape(8, -1).sum(0), 8))
    doc = load(tmp_path / "t.json")
    assert_trace_event_schema(doc)
    events = steps_of(doc)
    assert {e["cat"] for e in events} == {"all_reduce"} and {e["args"]["plan"] for e in events} == {"ring"}
    assert_each_call_runs_the_plan_once(events, plan, calls=2)
    assert_waits_end_after_their_signals(events)
    # Each rank waits once a call for its peers to arrive, and the call's steps start after the last arrived.
    arrivals = by_call(arrivals_of(doc))
    for key, evs in by_call(events).items():
        assert sorted(e["pid"] for e in arrivals[key]) == list(range(8))
        assert max(a["ts"] for a in arrivals[key]) <= min(e["ts"] for e in evs)


def test_each_group_of_axis_index_groups_has_tracks_of_its_own(tmp_path):
    plan = plan_of(Collective.ALL_REDUCE, "ring", 4)
    groups = [[0, 2, 4, 6], [1, 3, 5, 7]]
    f = jax.jit(jax.shard_map(lambda x: jaxcoll.all_reduce(x, "i", axis_index_groups=groups, algorithm=plan),
                              mesh=MESH, in_specs=P("i"), out_specs=P("i")))
    x = sharded(jnp.arange(8 * 16, dtype=jnp.float32))
    jax.block_until_ready(f(x))
    with jaxcoll.trace(tmp_path / "t.json"):
        jax.block_until_ready(f(x))
    doc = load(tmp_path / "t.json")
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(4)} | {10000 + r: f"group 1, rank {r}" for r in range(4)}
    events = steps_of(doc)
    for group in (0, 1):
        mine = [dict(e, pid=e["pid"] - 10000 * group) for e in events if e["pid"] // 10000 == group]
        assert_each_call_runs_the_plan_once(mine, plan, calls=1)


def test_a_200_step_scan_traces_200_calls_of_the_plan(tmp_path):
    plan = plan_of(Collective.ALL_REDUCE, "ring")

    def body(x):
        def one(c, _):
            return c * 0.5 + jaxcoll.all_reduce(c, "i", algorithm=plan) * (0.5 / 8), None  # carries stay varying
        return lax.scan(one, x, None, length=200)[0]

    f = jax.jit(jax.shard_map(body, mesh=MESH, in_specs=P("i"), out_specs=P("i")))
    x = sharded(jnp.ones(8 * 64, jnp.float32))
    jax.block_until_ready(f(x))
    with jaxcoll.trace(tmp_path / "t.json"):
        jax.block_until_ready(f(x))
    events = steps_of(load(tmp_path / "t.json"))
    assert_each_call_runs_the_plan_once(events, plan, calls=200)


def test_calls_outside_the_block_are_not_traced(tmp_path):
    plan = plan_of(Collective.ALL_REDUCE, "two_shot", 2)
    with jaxcoll.trace(tmp_path / "t.json"):
        runtime.run_plan(plan, [np.ones(4, np.float32)] * 2)
    runtime.run_plan(plan, [np.ones(4, np.float32)] * 2)
    with jaxcoll.trace(tmp_path / "u.json"):
        pass
    assert len(by_call(steps_of(load(tmp_path / "t.json")))) == 1
    assert steps_of(load(tmp_path / "u.json")) == []


def test_a_trace_that_could_not_be_written_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match=r"path='.*missing/t.json' cannot be written: its folder .* does not exist"):
        jaxcoll.trace(tmp_path / "missing" / "t.json")
    with pytest.raises(TypeError, match="path must be a file path"):
        jaxcoll.trace(3)


def test_a_call_that_times_out_still_writes_its_steps_up_to_the_hang(tmp_path):
    # Rank 0 puts, then waits for a signal nobody sends; rank 1 puts and is done.
    ref = ChunkRef
    steps0 = (Step(Op.PUT, (ref(0, Buffer.INPUT, 0),), (ref(0, Buffer.OUTPUT, 0),)), Step(Op.WAIT, sem=0))
    steps1 = (Step(Op.PUT, (ref(1, Buffer.INPUT, 0),), (ref(1, Buffer.OUTPUT, 0),)),)
    plan = Plan(Collective.CUSTOM, 2, (RankProgram(1, 1, 0, 1, (Lane(steps0),)),
                                       RankProgram(1, 1, 0, 0, (Lane(steps1),))), in_blocks=1, out_blocks=1)
    with pytest.raises(RuntimeError, match="never signalled"):
        with jaxcoll.trace(tmp_path / "t.json"):
            runtime.run_plan(plan, [np.ones(4, np.float32)] * 2, timeout_s=0.3)
    events = steps_of(load(tmp_path / "t.json"))
    assert sorted((e["pid"], e["args"]["step"], e["name"]) for e in events) == [(0, 0, "put"), (0, 1, "wait"),
                                                                                (1, 0, "put")]
    [wait] = [e for e in events if e["name"] == "wait"]
    assert wait["args"]["unfinished"] is True and wait["args"]["signal"] == 1 and "from" not in wait["args"]


def python_env(**env) -> dict:
    """The environment of a Python subprocess that imports this checkout's jaxcoll, with no JAXCOLL_ setting but
    `env`'s."""
    where = str(Path(jaxcoll.__file__).resolve().parents[1])
    path = os.pathsep.join([where] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JAXCOLL_")}
    return dict(clean, PYTHONPATH=path, **env)


def run_python(code: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env=python_env(**env), cwd=cwd)


def test_jaxcoll_trace_in_the_environment_traces_the_whole_run(tmp_path):
    code = ("import numpy as np, jaxcoll\n"
            "from jaxcoll import algorithms, runtime\n"
            "plan = algorithms.select('all_gather', 3, 64, np.float32, 'ring')\n"
            "for _ in range(4): runtime.run_plan(plan, [np.ones(4, np.float32)] * 3)\n")
    out = run_python(code, tmp_path, JAXCOLL_TRACE=str(tmp_path / "run.json"))
    assert out.returncode == 0, out.stderr[-2000:]
    doc = load(tmp_path / "run.json")
    assert_trace_event_schema(doc)
    assert_each_call_runs_the_plan_once(steps_of(doc), plan_of(Collective.ALL_GATHER, "ring", 3), calls=4)


def test_a_run_that_dies_of_a_timeout_still_writes_its_trace_at_exit(tmp_path):
    code = ("import numpy as np, jaxcoll\n"
            "from jaxcoll import runtime\n"
            "from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step\n"
            "put = lambda r: Step(Op.PUT, (ChunkRef(r, Buffer.INPUT, 0),), (ChunkRef(r, Buffer.OUTPUT, 0),))\n"
            "plan = Plan(Collective.CUSTOM, 2, (RankProgram(1, 1, 0, 1, (Lane((put(0), Step(Op.WAIT, sem=0))),)),\n"
            "            RankProgram(1, 1, 0, 0, (Lane((put(1),)),))), in_blocks=1, out_blocks=1)\n"
            "runtime.run_plan(plan, [np.ones(4, np.float32)] * 2, timeout_s=0.3)\n")
    out = run_python(code, tmp_path, JAXCOLL_TRACE=str(tmp_path / "run.json"))
    assert out.returncode != 0 and "never signalled" in out.stderr
    events = steps_of(load(tmp_path / "run.json"))
    assert [(e["pid"], e["name"], e["args"].get("unfinished", False)) for e in sorted(
        events, key=lambda e: (e["pid"], e["args"]["step"]))] == [(0, "put", False), (0, "wait", True),
                                                                  (1, "put", False)]


# A program that runs all_gather calls until it is stopped, printing the count after each; `{setup}` runs before the
# loop, `{trace}` opens the trace around it (or nothing, for JAXCOLL_TRACE).
LOOP = """\
import contextlib, signal, sys
import numpy as np, jaxcoll
from jaxcoll import algorithms, runtime
{setup}
plan = algorithms.select('all_gather', 3, 64, np.float32, 'ring')
with {trace}:
    for n in range(1, 100000):
        runtime.run_plan(plan, [np.ones(4, np.float32)] * 3)
        print(n, flush=True)
"""


def stop_after_calls(tmp_path, sig, calls=3, setup="", block=True) -> tuple[subprocess.Popen, str]:
    """Run LOOP tracing to tmp_path/run.json (a `with jaxcoll.trace` block, or JAXCOLL_TRACE), send it `sig` once
    it has finished `calls` calls, and wait for it to end; the process and its stderr."""
    path = tmp_path / "run.json"
    code = LOOP.format(setup=setup, trace=f"jaxcoll.trace({str(path)!r})" if block else "contextlib.nullcontext()")
    env = python_env() if block else python_env(JAXCOLL_TRACE=str(path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path)
    try:
        for line in proc.stdout:
            if int(line) >= calls:
                proc.send_signal(sig)
                break
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc, err


@pytest.mark.parametrize("block", [True, False], ids=["with_block", "whole_run"])
def test_a_process_stopped_by_sigterm_writes_its_trace_and_dies_of_the_signal(tmp_path, block):
    proc, err = stop_after_calls(tmp_path, signal.SIGTERM, block=block)
    assert proc.returncode == -signal.SIGTERM, err[-2000:]  # the signal took its course: the process died of it
    doc = load(tmp_path / "run.json")
    assert_trace_event_schema(doc)
    events = steps_of(doc)
    calls = len(by_call(events))
    assert calls >= 3  # every call that finished before the signal, each the plan's steps once
    assert_each_call_runs_the_plan_once(events, plan_of(Collective.ALL_GATHER, "ring", 3), calls=calls)


def test_a_process_stopped_by_sigint_writes_its_trace_and_raises_keyboard_interrupt(tmp_path):
    proc, err = stop_after_calls(tmp_path, signal.SIGINT, block=False)
    # Python ends a program that KeyboardInterrupt stopped by SIGINT itself (its exit status names the signal).
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, err[-2000:]
    events = steps_of(load(tmp_path / "run.json"))
    assert_each_call_runs_the_plan_once(events, plan_of(Collective.ALL_GATHER, "ring", 3), calls=len(by_call(events)))


def test_a_sigterm_handler_of_the_program_is_left_to_run(tmp_path):
    setup = "signal.signal(signal.SIGTERM, lambda *_: (print('own handler', file=sys.stderr), sys.exit(3)))"
    proc, err = stop_after_calls(tmp_path, signal.SIGTERM, setup=setup)
    assert proc.returncode == 3 and "own handler" in err, err[-2000:]
    events = steps_of(load(tmp_path / "run.json"))  # written as the block ended, by the handler's SystemExit
    assert len(by_call(events)) >= 3


def test_the_stop_signals_are_caught_only_while_a_trace_is_open(tmp_path):
    def own(*_):
        pass

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with jaxcoll.trace(tmp_path / "t.json"):
        inside = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert all(h is not b and h.__module__ == "jaxcoll.observe.trace" for h, b in zip(inside, before))
    previous = signal.signal(signal.SIGTERM, own)
    try:
        with jaxcoll.trace(tmp_path / "t.json"):
            assert signal.getsignal(signal.SIGTERM) is own
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)
    # Python sets handlers from the main thread only: a trace opened on another works, and catches nothing.
    seen = []
    thread = threading.Thread(target=lambda: seen.append(jaxcoll.trace(tmp_path / "u.json").__enter__().__exit__(
        None, None, None)))
    thread.start()
    thread.join()
    assert seen == [False] and signal.getsignal(signal.SIGTERM) is before[0]


# shm: the processes share this host's memory; tcp: each counts as a host of its own, so a rank of the other
# process is reached over the network transport (the all_to_all's reads of it are in flight together).
@pytest.mark.parametrize("collective, name, transport", [("all_reduce", "ring", "shm"),
                                                         ("all_to_all", "hierarchical", "tcp")])
def test_a_two_process_job_writes_one_file_per_process_with_its_ranks_steps(tmp_path, collective, name, transport):
    path = tmp_path / "job.json"
    env = {"JAXCOLL_TIMEOUT": "100"} | ({"JAXCOLL_TRANSPORT": "tcp"} if transport == "tcp" else {})
    results = launch(2, [str(HERE / "trace_cases.py"), str(path), collective, name], local_devices=2,
                     timeout_s=240, env=env)
    for r in results:
        assert r.returncode == 0, f"process {r.process}:\n{r.stderr[-4000:]}"
        # jaxcoll.stats() in each process counts the calls it ran: the warm-up and the traced ones.
        assert "stats calls 4" in r.stdout, r.stdout[-2000:]
    plan = algorithms.select(collective, 4, 1024, np.float32, name, processes=(0, 0, 1, 1))
    for p in range(2):
        doc = load(tmp_path / f"job.p{p}.json")
        assert_trace_event_schema(doc)
        assert doc["otherData"]["process"] == p and doc["otherData"]["processes"] == 2
        events = steps_of(doc)
        assert {e["pid"] for e in events} == {2 * p, 2 * p + 1}  # process p hosts ranks 2p and 2p+1
        assert_each_call_runs_the_plan_once(events, plan, calls=3, ranks={2 * p, 2 * p + 1})
    # Both processes are on this host: one clock, so every wait ends after the signal it consumed, whichever
    # process sent it. A call is the same call in both files when its launch and count in the launch are.
    both = [e for p in range(2) for e in steps_of(load(tmp_path / f"job.p{p}.json"))]
    for e in both:
        e["args"]["call"] = (e["args"]["launch"], e["args"]["iteration"])
    assert_waits_end_after_their_signals(both)
    # Each rank of the group arrives once a call, in its own process's file, and its steps start after it.
    arrivals = [e for p in range(2) for e in arrivals_of(load(tmp_path / f"job.p{p}.json"))]
    for e in arrivals:
        e["args"]["call"] = (e["args"]["launch"], e["args"]["iteration"])
    arrived = by_call(arrivals)
    assert arrived.keys() == by_call(both).keys() and len(arrived) == 3
    for key, evs in by_call(both).items():
        assert sorted(a["pid"] for a in arrived[key]) == [0, 1, 2, 3]
        for a in arrived[key]:
            assert a["args"]["ranks"] == 4
            assert a["ts"] + a["dur"] <= min(e["ts"] for e in evs if e["pid"] == a["pid"])
        # A rank's wait for its peers ends once the last rank of the group, in either process, has arrived.
        last = max(a["ts"] for a in arrived[key])
        assert all(a["ts"] + a["dur"] >= last for a in arrived[key])


def test_a_call_that_a_process_never_arrives_at_leaves_the_waits_for_it_unfinished(tmp_path):
    # Process 1 (ranks 4-7) never makes the second call: process 0's ranks wait for it until the timeout.
    results = launch(2, [str(HERE / "multiprocess_cases.py"), "never_arrives_traced"], local_devices=4,
                     timeout_s=120, env={"JAXCOLL_TIMEOUT": "3", "TRACE_PATH": str(tmp_path / "t.json")})
    assert "timed out waiting for every process to arrive" in results[0].stdout, results[0].stderr[-3000:]
    doc = load(tmp_path / "t.p0.json")
    assert steps_of(doc) == []  # no step ran
    arrivals = arrivals_of(doc)
    assert sorted(e["pid"] for e in arrivals) == [0, 1, 2, 3]
    for e in arrivals:
        assert e["args"]["unfinished"] is True and e["dur"] > 2e6, e  # until the call failed, 3 s after it began


def test_trace_show_names_the_rank_that_arrived_last_across_processes(tmp_path):
    # Two processes' files of one call whose rank 3 (process 1) arrived last; jaxcoll trace show reads them together.
    from jaxcoll.observe import trace_events, trace_show

    def arrival(rank, ts, process):
        args = {"callsite": 5, "call": 7 * process, "plan": "ring", "launch": 41, "iteration": 1, "ranks": 4}
        return {"name": "wait for peers", "cat": "all_reduce", "ph": "X", "ts": ts, "dur": 100.0 - ts,
                "pid": rank, "tid": -1, "args": args}

    def step(rank, process):
        args = {"callsite": 5, "call": 7 * process, "plan": "ring", "launch": 41, "iteration": 1, "step": 0,
                "bytes": 64}
        return {"name": "put", "cat": "all_reduce", "ph": "X", "ts": 100.0, "dur": 1.0, "pid": rank, "tid": 0,
                "args": args}

    host = {"host": "h", "realtime_minus_monotonic_ns": 0}
    for p, ranks in ((0, (0, 1)), (1, (2, 3))):
        doc = {"traceEvents": [e for r in ranks for e in (arrival(r, 10.0 * r, p), step(r, p))], "otherData": host}
        (tmp_path / f"t.p{p}.json").write_text(json.dumps(doc))
    def last_in(text):  # the summary's "last in" column, by rank
        rows = [line.split() for line in text.splitlines()]
        return {int(row[1]): int(row[7]) for row in rows if row[0] == "rank" and row[1].isdigit()}

    both = trace_show.summary(trace_events.load([tmp_path / "t.p0.json", tmp_path / "t.p1.json"]))
    assert last_in(both) == {0: 0, 1: 0, 2: 0, 3: 1}
    # One process's file alone cannot say who was last: it says so instead of naming its own last rank.
    alone = trace_show.summary(trace_events.load([tmp_path / "t.p0.json"]))
    assert "1 call(s) have arrivals of only some of their group's ranks" in alone
    assert last_in(alone) == {0: 0, 1: 0}


def test_trace_show_summarises_and_draws_the_lanes(tmp_path):
    from jaxcoll.cli import main
    plan = plan_of(Collective.ALL_REDUCE, "two_shot", 4)
    with jaxcoll.trace(tmp_path / "t.json"):
        runtime.run_plan(plan, [np.ones(16, np.float32)] * 4)
    out = run_python(f"from jaxcoll.cli import main; raise SystemExit(main(['trace', 'show', 't.json', '--out', "
                     f"'lanes.png']))", tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    for r in range(4):
        assert f"rank {r}" in out.stdout
    assert "wrote lanes.png" in out.stdout
    assert (tmp_path / "lanes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["trace", "show", str(tmp_path / "t.json")]) == 0


def test_trace_rejects_a_path_that_is_not_one():
    with pytest.raises(TypeError, match="path must be a file path"):
        jaxcoll.trace(3)
