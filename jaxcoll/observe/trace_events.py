"""The trace file of `jaxcoll.trace`: the runtime's step events (csrc/trace.hpp) as Chrome/Perfetto trace-event JSON
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU), and read back.

One "X" (complete) event per step: pid is the rank (`group * 10000 + rank` for a call site's later groups), tid the
lane, ts and dur in microseconds of the host's monotonic clock (CLOCK_MONOTONIC, shared by every process of a host);
"M" events name the tracks "rank r" and "lane l". Each rank also has an "arrival" track (tid -1): one "wait for
peers" event a call, from the rank's arrival until the last of its group's ranks arrived and the call started (in
a group spanning processes: until this process found every other process's side of the call), so the rank that
arrives last (the slow one) is the one whose wait is shortest. Events of a call of a group spanning processes carry
`launch` and `iteration`, which name the call alike in every process's file (`call` numbers the calls of one
process). `otherData` says
which process wrote the file and pairs the monotonic clock with the wall clock, so that files written on different
hosts can be put on one time axis (`load` does; its accuracy is that of the hosts' clock synchronisation, NTP:
milliseconds). No JAX here.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib

import numpy as np

from jaxcoll.plan.ir import OP_CODES

# csrc/trace.hpp's TraceEvent, field for field (the native module checks the size: trace_event_size()).
EVENT = np.dtype([("start_ns", "<i8"), ("end_ns", "<i8"), ("callsite", "<i8"), ("call", "<i8"), ("bytes", "<i8"),
                  ("group", "<i4"), ("rank", "<i4"), ("lane", "<i4"), ("step", "<i4"), ("op", "<i4"),
                  ("peer", "<i4"), ("sem", "<i4"), ("count", "<i4"), ("flags", "<i4"), ("iteration", "<i4"),
                  ("launch", "<i8")])
UNFINISHED = 1  # kTraceUnfinished: the step had not ended when its call failed
ARRIVAL = -1  # kTraceArrival: the op and lane of a rank's wait for its peers to arrive
ARRIVAL_NAME, ARRIVAL_TRACK = "wait for peers", "arrival"
OP_NAMES = {code: op.value for op, code in OP_CODES.items()} | {ARRIVAL: ARRIVAL_NAME}
GROUP_STRIDE = 10000  # pid = group * GROUP_STRIDE + rank
_writes = itertools.count()  # each write's temporary file


def pid_of(group: int, rank: int) -> int:
    return group * GROUP_STRIDE + rank


def track_name(pid: int) -> str:
    group, rank = divmod(pid, GROUP_STRIDE)
    return f"rank {rank}" if group == 0 else f"group {group}, rank {rank}"


def to_json(events: np.ndarray, other: dict) -> dict:
    """The trace-event document of `events` (an array of EVENT), with the call sites' names from this process's
    lowering (jaxcoll.observe.sites); `other` becomes its otherData."""
    from jaxcoll.observe import sites

    names = {}
    for callsite in np.unique(events["callsite"]).tolist():
        site = sites.lookup(callsite)
        names[callsite] = ((site.collective, site.plan, site.nranks) if site
                           else ("run_plan" if callsite < 0 else "?", "?", None))
    out = []
    tracks = set()
    columns = [events[name].tolist() for name in EVENT.names]  # far faster than a structured array's tolist
    for (start, end, callsite, call, nbytes, group, rank, lane, step, op, peer, sem, count, flags, iteration,
         launch) in zip(*columns):
        collective, plan, nranks = names[callsite]
        name = OP_NAMES.get(op, f"op {op}")
        args = {"callsite": callsite, "call": call, "plan": plan}
        if iteration:  # a call of a group spanning processes: how every process's file names it
            args.update(launch=launch, iteration=iteration)
        if op != ARRIVAL:
            args["step"] = step
        elif nranks is not None:
            args["ranks"] = nranks  # the group's size: whether the files read hold every rank's arrival
        if name == "wait":
            args.update(sem=sem, signal=count)
            if peer != -1:
                args["from"] = peer if peer >= 0 else "several ranks"
        elif name == "signal":
            args.update(to=peer, sem=sem)
        elif name not in ("barrier", ARRIVAL_NAME):
            args.update(bytes=nbytes, **({"peer": peer} if peer >= 0 else {}))
        if flags & UNFINISHED:
            args["unfinished"] = True
        pid = pid_of(group, rank)
        tracks.add((pid, lane))
        out.append({"name": name, "cat": collective, "ph": "X", "ts": start / 1e3, "dur": (end - start) / 1e3,
                    "pid": pid, "tid": lane, "args": args})
    meta = []
    for pid in sorted({p for p, _ in tracks}):
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": track_name(pid)}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for pid, lane in sorted(tracks):
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": lane,
                     "args": {"name": ARRIVAL_TRACK if lane == ARRIVAL else f"lane {lane}"}})
    return {"traceEvents": meta + out, "displayTimeUnit": "ns", "otherData": other}


def write(path: pathlib.Path, events: np.ndarray, other: dict) -> None:
    """Write the trace file (through a temporary file, so a reader never sees half of one; a file of its own for
    each write, since a stop signal may write the file while the program is writing it)."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + f".{os.getpid()}.{next(_writes)}.tmp")
    tmp.write_text(json.dumps(to_json(events, other), separators=(",", ":")))
    os.replace(tmp, path)


def load(paths) -> list[dict]:
    """The "X" events of one or more trace files (one per process of a job) on one time axis: files of one host
    share its monotonic clock as they are; a file from another host is moved by the difference of the hosts'
    wall-clock offsets. Each event gets `args["file"]`, its file's position in `paths`."""
    docs = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    if not docs:
        return []
    base = docs[0].get("otherData", {})
    out = []
    for i, doc in enumerate(docs):
        other = doc.get("otherData", {})
        shift_us = 0.0
        if other.get("host") != base.get("host") and "realtime_minus_monotonic_ns" in other:
            shift_us = (other["realtime_minus_monotonic_ns"] - base["realtime_minus_monotonic_ns"]) / 1e3
        for e in doc["traceEvents"]:
            if e.get("ph") != "X":
                continue
            out.append({**e, "ts": e["ts"] + shift_us, "args": {**e.get("args", {}), "file": i}})
    return out
