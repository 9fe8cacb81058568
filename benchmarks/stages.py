"""Where a cross-process collective's time goes, stage by stage, against the copy bandwidth measured in the same
run: the floor under a job of several processes on this machine (docs/benchmarks.md, "Across processes").

A job of `--processes` processes (jaxcoll.launch) runs jaxcoll's collective and XLA's own cross-process one (gloo)
alternating call by call. Each process measures a plain copy (numpy, one thread: the rate one thread of the
runtime can move bytes at) before and after the calls, and traces its jaxcoll calls (`jaxcoll.trace`). From the
trace and the plan each process reports, per stage (an op of the plan: `read_reduce`, `read_reduce_put`, ...), the
bytes its ranks' steps read and wrote, the thread time they took, and that rate against the copy's. What the trace
does not cover as data (the waits for signals, the call's publication, staging copies into and out of shared
memory, the wait for the other processes) is the call's wall time less its data steps, per process. The floor
prices every byte of the data steps at the copy's rate on the threads the process has (its share of the cores).

    python benchmarks/stages.py [--processes 2] [--devices 8] [--size 16M] [--calls 10] [--transport shm|tcp]
        [--algorithm hierarchical] [--markdown stages.md]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections import defaultdict

OPS_WITHOUT_DATA = {"wait", "signal", "barrier"}


def worker(args) -> None:
    """One process of the job: time both sides, trace jaxcoll's calls, print one JSON line of what it measured."""
    import jaxcoll.launch

    process, _ = jaxcoll.launch.initialize()
    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jaxcoll
    from jaxcoll import algorithms
    from jaxcoll.cli.bench import copy_bandwidth, parse_size
    from jaxcoll.observe import trace_events
    from jaxcoll.observe.trace import process_path

    devices = jax.devices()
    n = len(devices)
    processes = tuple(int(d.process_index) for d in devices)
    size = parse_size(args.size)
    elements = size // 4
    plan = algorithms.select(args.collective, n, size, np.float32, args.algorithm, processes=processes)
    mesh = Mesh(np.array(devices), ("i",))
    ours = jax.jit(jax.shard_map(lambda x: jaxcoll.all_reduce(x, "i", algorithm=plan), mesh=mesh,
                                 in_specs=P("i"), out_specs=P("i")))
    theirs = jax.jit(jax.shard_map(lambda x: lax.psum(x, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    x = jax.make_array_from_callback((n * elements,), NamedSharding(mesh, P("i")),
                                     lambda index: np.full(elements, 1 + process, np.float32))
    for _ in range(2):
        jax.block_until_ready(ours(x))
        jax.block_until_ready(theirs(x))
    copy_before = copy_bandwidth(4 * size, threads=1)
    walls: dict[str, list[float]] = {"jaxcoll": [], "xla": []}
    path = os.path.join(args.out, "trace.json")
    with jaxcoll.trace(path):
        for _ in range(args.calls):
            for side, f in (("jaxcoll", ours), ("xla", theirs)):
                t0 = time.perf_counter()
                jax.block_until_ready(f(x))
                walls[side].append(time.perf_counter() - t0)
    copy_after = copy_bandwidth(4 * size, threads=1)

    # Each traced step's bytes moved: its chunk range's bytes for every source and every destination it names.
    step = {(r, l, i): s for r, rank in enumerate(plan.ranks) for l, lane in enumerate(rank.lanes)
            for i, s in enumerate(lane.steps)}
    events = trace_events.load([process_path(pathlib.Path(path))])
    stage_s: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    stage_bytes: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for e in events:
        a = e["args"]
        if e["name"] in OPS_WITHOUT_DATA or e["tid"] < 0:
            continue
        s = step[(e["pid"], e["tid"], a["step"])]
        stage_s[e["name"]][a["call"]] += e["dur"] / 1e6
        stage_bytes[e["name"]][a["call"]] += a["bytes"] * (len(s.srcs) + len(s.dsts))
    calls = sorted({c for per_call in stage_s.values() for c in per_call})
    # The threads that run this process's lanes at once: its ranks, at most its share of the cores (the job's
    # processes share this machine).
    threads = max(1, min((os.cpu_count() or 1) // (max(processes) + 1), processes.count(process)))
    print(json.dumps({
        "process": process, "ranks": processes.count(process), "plan": plan.name, "threads": threads,
        "copy_GBps": [copy_before / 1e9, copy_after / 1e9], "walls": walls, "calls": len(calls),
        "stages": {name: {"seconds": [stage_s[name][c] for c in calls],
                          "bytes": statistics.median(stage_bytes[name][c] for c in calls)} for name in stage_s},
    }), flush=True)


def wake_latencies(paths) -> list[float]:
    """Seconds from each cross-process signal's end to the end of the wait it satisfied (the k-th wait on a rank's
    semaphore needs its k-th signal), over every traced call. The n-th traced call of each process is one call of
    the job; one host, so the files share a clock."""
    from jaxcoll.observe import trace_events

    events = trace_events.load(paths)
    order: dict[int, list[int]] = defaultdict(list)
    for e in events:
        order[e["args"]["file"]].append(e["args"]["call"])
    index = {f: {c: i for i, c in enumerate(sorted(set(calls)))} for f, calls in order.items()}
    signals: dict[tuple, list[tuple[float, int]]] = defaultdict(list)
    for e in events:
        if e["name"] == "signal":
            key = (index[e["args"]["file"]][e["args"]["call"]], e["args"]["to"], e["args"]["sem"])
            signals[key].append((e["ts"] + e["dur"], e["args"]["file"]))
    out = []
    for e in events:
        a = e["args"]
        if e["name"] != "wait":
            continue
        sent = sorted(signals[index[a["file"]][a["call"]], e["pid"], a["sem"]])
        if len(sent) >= a["signal"] and sent[a["signal"] - 1][1] != a["file"]:
            out.append(max(0.0, e["ts"] + e["dur"] - sent[a["signal"] - 1][0]) / 1e6)
    return out


def report(results: list[dict], args) -> list[str]:
    """The tables, as markdown lines."""
    r0 = results[0]
    lines = [f"{args.collective} of {args.size} a rank over {args.devices} ranks in {args.processes} processes "
             f"({args.transport}), plan {r0['plan']}; {r0['calls']} calls a side, alternating with XLA's (gloo); "
             f"copy rate of one thread, before/after: " +
             ", ".join(f"p{r['process']} {r['copy_GBps'][0]:.1f}/{r['copy_GBps'][1]:.1f} GB/s" for r in results), "",
             "| process | stage | bytes a call MiB | thread ms a call, median (min-max) | GB/s | % of the copy |",
             "|---|---|---:|---:|---:|---:|"]
    for r in results:
        copy = max(r["copy_GBps"])
        for name, st in r["stages"].items():
            med = statistics.median(st["seconds"])
            rate = st["bytes"] / med / 1e9
            lines.append(f"| {r['process']} | {name} | {st['bytes'] / 2**20:.0f} | {med * 1e3:.1f} "
                         f"({min(st['seconds']) * 1e3:.1f}-{max(st['seconds']) * 1e3:.1f}) | {rate:.1f} | "
                         f"{100 * rate / copy:.0f}% |")
    lines += ["", "| process | threads | jaxcoll wall ms, median (min-max) | data steps ms (thread time / threads) | "
              "the rest ms (waits, publication, staging, the other processes) | floor ms (data bytes at the copy "
              "rate) | gloo wall ms | gloo / jaxcoll |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        ours, xla = r["walls"]["jaxcoll"], r["walls"]["xla"]
        traced = sum(statistics.median(st["seconds"]) for st in r["stages"].values()) / r["threads"]
        floor = sum(st["bytes"] for st in r["stages"].values()) / (max(r["copy_GBps"]) * 1e9) / r["threads"]
        wall = statistics.median(ours)
        lines.append(f"| {r['process']} | {r['threads']} | {wall * 1e3:.1f} ({min(ours) * 1e3:.1f}-"
                     f"{max(ours) * 1e3:.1f}) | {traced * 1e3:.1f} | "
                     f"{(wall - traced) * 1e3:.1f} | {floor * 1e3:.1f} | {statistics.median(xla) * 1e3:.1f} | "
                     f"{statistics.median(xla) / wall:.2f}x |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--devices", type=int, default=8, help="CPU devices in all processes together")
    p.add_argument("--size", default="16M", help="per-rank input size")
    p.add_argument("--collective", default="all_reduce", choices=["all_reduce"])
    p.add_argument("--algorithm", default="hierarchical")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--transport", choices=("shm", "tcp"), default="shm")
    p.add_argument("--markdown", metavar="MD")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.devices % args.processes:
        raise SystemExit(f"stages: --devices={args.devices} does not split over --processes={args.processes}")
    from jaxcoll import launch

    with tempfile.TemporaryDirectory() as out:
        env = {"JAXCOLL_TRANSPORT": "tcp"} if args.transport == "tcp" else {}
        results = launch.launch(args.processes, [__file__, *sys.argv[1:], "--worker", "--out", out],
                                local_devices=args.devices // args.processes, env=env, timeout_s=1800)
        traces = sorted(pathlib.Path(out).glob("trace.p*.json"))
        wakes = wake_latencies(traces) if not [r for r in results if r.returncode] else []
    failed = [r for r in results if r.returncode != 0]
    for r in failed:
        print(f"process {r.process} exited with {r.returncode}:\n{r.stderr[-3000:]}", file=sys.stderr)
    if failed:
        raise SystemExit(1)
    measured = [json.loads(r.stdout.strip().splitlines()[-1]) for r in results]
    lines = report(measured, args)
    if wakes:
        lines += ["", f"A wait for a signal from another process ends {statistics.median(wakes) * 1e3:.2f} ms after the "
                  f"signal (median of {len(wakes)} waits; 90th percentile "
                  f"{sorted(wakes)[int(0.9 * (len(wakes) - 1))] * 1e3:.2f} ms, most {max(wakes) * 1e3:.2f} ms)."]
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
