"""What every trace test checks of a trace file, whichever executor wrote it (test_trace.py: the CPU runtime;
test_trace_cuda.py: the CUDA executor): each step of the plan once per call, waits after their signals, the
trace-event schema."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from jaxcoll.observe import trace_events
from jaxcoll.plan import Plan


def load(path) -> dict:
    return json.loads(Path(path).read_text())


def steps_of(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] != "wait for peers"]


def arrivals_of(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "wait for peers"]


def by_call(events: list[dict]) -> dict:
    calls = defaultdict(list)
    for e in events:
        calls[e["args"]["callsite"], e["args"]["call"]].append(e)
    return calls


def plan_steps(plan: Plan, ranks=None) -> Counter:
    """(rank, lane, position, op) of every step of the plan (of `ranks` only, when given)."""
    return Counter((r, l, i, s.op.value) for r, l, i, s in plan.steps() if ranks is None or r in ranks)


def traced_steps(events: list[dict]) -> Counter:
    return Counter((e["pid"], e["tid"], e["args"]["step"], e["name"]) for e in events)


def assert_each_call_runs_the_plan_once(events, plan: Plan, calls: int, ranks=None):
    per_call = by_call(events)
    assert len(per_call) == calls
    want = plan_steps(plan, ranks)
    for key, evs in per_call.items():
        assert traced_steps(evs) == want, f"call {key}"


def assert_trace_event_schema(doc: dict):
    assert isinstance(doc["traceEvents"], list)
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and e["dur"] >= 0 and isinstance(e["args"], dict)
    named = {(e["pid"], e.get("tid"), e["name"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and "name" in e["args"]}
    for e in steps_of(doc):
        assert named[e["pid"], 0, "process_name"] == trace_events.track_name(e["pid"])
        assert named[e["pid"], e["tid"], "thread_name"] == f"lane {e['tid']}"
    for e in arrivals_of(doc):
        assert named[e["pid"], e["tid"], "thread_name"] == "arrival" and e["tid"] == -1


def assert_waits_end_after_their_signals(events: list[dict]):
    """The k-th wait a rank's semaphore satisfies needs k signals sent to it: it ends after the k-th signal (in
    start order) began."""
    for evs in by_call(events).values():
        signals = defaultdict(list)
        for e in evs:
            if e["name"] == "signal":
                signals[e["args"]["to"], e["args"]["sem"]].append(e["ts"])
        for w in (e for e in evs if e["name"] == "wait"):
            sent = sorted(signals[w["pid"], w["args"]["sem"]])
            k = w["args"]["signal"]
            assert len(sent) >= k
            assert w["ts"] + w["dur"] >= sent[k - 1]
