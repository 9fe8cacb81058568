"""Where a CPU collective's time goes, per call: the counts that a busy machine does not move.

Times swing with other work on a 2-core VM; counts per call do not: the process's user and system CPU time
(getrusage, every thread), minor page faults, voluntary and involuntary context switches, and from the
scheduler's own per-thread counters (/proc/self/task/*/schedstat, in nanoseconds) the time the process's threads
ran and the time they were runnable but waited for a core (less what reading the counters costs). This program
runs jaxcoll's and XLA's version of one collective (the programs of `python -m jaxcoll bench`, one call per launch from
1 MiB up), alternating call by call, and prints per run and side the median and range of the wall time and the
median of each count. A side whose system time follows its page faults pays for fresh memory (the kernel zeroes
every page a call writes first: docs/performance.md, "Why large calls vary"); one whose context switches grow
with the wall time waits on other threads. `--by-speed` then sets the faster half of each side's calls (all runs
together) beside its slowest quarter: counts that differ between them are what the slow calls do more of.

    python benchmarks/call_costs.py [--collective all_reduce] [--sizes 16M,64M] [--runs 3] [--calls 10] [--by-speed]

Set JAXCOLL_HUGEPAGE_BYTES=0 to see jaxcoll's calls without transparent huge pages on its outputs.
"""

from __future__ import annotations

import argparse
import glob
import os
import resource
import statistics
import time


KEYS = ("user ms", "sys ms", "faults", "vol cs", "invol cs", "ran ms", "queued ms")
TIMES = ("ran ms", "queued ms")  # nanosecond counters: printed to the hundredth


def scheduled_ns() -> tuple[int, int]:
    """(ran, waited for a core) in ns, summed over this process's threads: the kernel's schedstat counters."""
    ran = waited = 0
    for path in glob.glob("/proc/self/task/*/schedstat"):
        try:
            with open(path) as f:
                fields = f.read().split()
        except OSError:  # the thread ended between the listing and the read
            continue
        ran, waited = ran + int(fields[0]), waited + int(fields[1])
    return ran, waited


def schedstat_overhead_ns() -> tuple[float, float]:
    """What two reads of the counters add to them (the reading thread runs), the median of 21 empty pairs."""
    pairs = []
    for _ in range(21):
        a, b = scheduled_ns(), scheduled_ns()
        pairs.append((b[0] - a[0], b[1] - a[1]))
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def counts_of_call(f, x, overhead_ns: tuple[float, float] = (0.0, 0.0)) -> dict[str, float]:
    """Wall ms, user and system CPU ms of every thread, minor faults, context switches, and the ms the threads ran
    and waited for a core (less `overhead_ns`, what reading those costs) of one call of f(x)."""
    import jax
    s0 = scheduled_ns()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    jax.block_until_ready(f(x))
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    s1 = scheduled_ns()
    return {"ms": wall * 1e3, "user ms": (r1.ru_utime - r0.ru_utime) * 1e3,
            "sys ms": (r1.ru_stime - r0.ru_stime) * 1e3, "faults": r1.ru_minflt - r0.ru_minflt,
            "vol cs": r1.ru_nvcsw - r0.ru_nvcsw, "invol cs": r1.ru_nivcsw - r0.ru_nivcsw,
            "ran ms": max(0.0, s1[0] - s0[0] - overhead_ns[0]) / 1e6,
            "queued ms": max(0.0, s1[1] - s0[1] - overhead_ns[1]) / 1e6}


def main() -> None:
    from jaxcoll.cli.bench import format_size, parse_size

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collective", default="all_reduce")
    p.add_argument("--sizes", default="16M,64M", help="per-rank input sizes, comma-separated")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--calls", type=int, default=10, help="timed calls per side and run")
    p.add_argument("--by-speed", action="store_true",
                   help="also print each side's median counts over its faster half and its slowest quarter of calls")
    args = p.parse_args()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}")
    import jax
    import numpy as np

    from jaxcoll.tune import measure

    mesh = jax.make_mesh((args.devices,), ("i",))
    n = args.devices
    print(f"{args.collective}, {n} CPU devices, {os.cpu_count()} cores; per call: median (min-max) wall ms and "
          f"median counts")
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        count = measure.per_rank_elements(nbytes, n, "float32")
        iters = measure.iterations(count * 4)
        programs = {side: measure.program(args.collective, mesh, "i", iters, "auto" if side == "jaxcoll" else "xla")
                    for side in ("jaxcoll", "xla")}
        x = jax.make_array_from_callback((n * count,), jax.NamedSharding(mesh, jax.P("i")),
                                         lambda index: np.full(n * count, 1e-3, np.float32)[index])
        for f in programs.values():
            for _ in range(3):
                jax.block_until_ready(f(x))
        overhead = schedstat_overhead_ns()  # with this size's threads started
        print(f"\n{format_size(nbytes)} per rank ({iters} call(s) per launch; counts are per launch)")
        print("| run | load | side | ms | " + " | ".join(KEYS) + " |\n|---|---|---|---|" + "---|" * len(KEYS))
        every = {side: [] for side in programs}
        for run in range(args.runs):
            rows = {side: [] for side in programs}
            for _ in range(args.calls):
                for side, f in programs.items():
                    rows[side].append(counts_of_call(f, x, overhead))
            load = os.getloadavg()[0]
            for side, calls in rows.items():
                med = {k: statistics.median(c[k] for c in calls) for k in calls[0]}
                ms = [c["ms"] for c in calls]
                print(f"| {run} | {load:.1f} | {side} | {med['ms']:.1f} ({min(ms):.1f}-{max(ms):.1f}) | "
                      + " | ".join(f"{med[k]:.0f}" if k not in TIMES else f"{med[k]:.2f}" for k in KEYS)
                      + " |", flush=True)
                every[side] += calls
        if args.by_speed:
            print_by_speed(every)


def print_by_speed(calls_by_side: dict[str, list[dict[str, float]]]) -> None:
    """Each side's median counts over its faster half of calls and over its slowest quarter."""
    print("\n| side | calls | ms | " + " | ".join(KEYS) + " |\n|---|---|---|" + "---|" * len(KEYS))
    for side, calls in calls_by_side.items():
        ordered = sorted(calls, key=lambda c: c["ms"])
        for name, part in (("faster half", ordered[:max(1, len(ordered) // 2)]),
                           ("slowest quarter", ordered[len(ordered) - max(1, len(ordered) // 4):])):
            med = {k: statistics.median(c[k] for c in part) for k in ("ms", *KEYS)}
            print(f"| {side} | {name} ({len(part)}) | {med['ms']:.2f} | " + " | ".join(f"{med[k]:.1f}" for k in KEYS)
                  + " |", flush=True)


if __name__ == "__main__":
    main()
