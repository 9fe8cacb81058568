"""Where a CPU collective's time goes, per call: the counts that a busy machine does not move.

Times swing with other work on a 2-core VM; counts per call do not: the process's user and system CPU time
(getrusage, every thread), minor page faults, voluntary and involuntary context switches. This program runs
jaxcoll's and XLA's version of one collective (the programs of `python -m jaxcoll bench`, one call per launch from
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
import os
import resource
import statistics
import time


def counts_of_call(f, x) -> dict[str, float]:
    """Wall ms, user and system CPU ms of every thread, minor faults and context switches of one call of f(x)."""
    import jax
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    jax.block_until_ready(f(x))
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"ms": wall * 1e3, "user ms": (r1.ru_utime - r0.ru_utime) * 1e3,
            "sys ms": (r1.ru_stime - r0.ru_stime) * 1e3, "faults": r1.ru_minflt - r0.ru_minflt,
            "vol cs": r1.ru_nvcsw - r0.ru_nvcsw, "invol cs": r1.ru_nivcsw - r0.ru_nivcsw}


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
        print(f"\n{format_size(nbytes)} per rank ({iters} call(s) per launch; counts are per launch)")
        print("| run | load | side | ms | user ms | sys ms | faults | vol cs | invol cs |\n|---|---|---|---|---|---|---|---|---|")
        every = {side: [] for side in programs}
        for run in range(args.runs):
            rows = {side: [] for side in programs}
            for _ in range(args.calls):
                for side, f in programs.items():
                    rows[side].append(counts_of_call(f, x))
            load = os.getloadavg()[0]
            for side, calls in rows.items():
                med = {k: statistics.median(c[k] for c in calls) for k in calls[0]}
                ms = [c["ms"] for c in calls]
                print(f"| {run} | {load:.1f} | {side} | {med['ms']:.1f} ({min(ms):.1f}-{max(ms):.1f}) | "
                      + " | ".join(f"{med[k]:.0f}" for k in KEYS)
                      + " |", flush=True)
                every[side] += calls
        if args.by_speed:
            print_by_speed(every)


KEYS = ("user ms", "sys ms", "faults", "vol cs", "invol cs")


def print_by_speed(calls_by_side: dict[str, list[dict[str, float]]]) -> None:
    """Each side's median counts over its faster half of calls and over its slowest quarter."""
    print("\n| side | calls | ms | " + " | ".join(KEYS) + " |\n|---|---|---|" + "---|" * len(KEYS))
    for side, calls in calls_by_side.items():
        ordered = sorted(calls, key=lambda c: c["ms"])
        for name, part in (("faster half", ordered[:len(ordered) // 2]),
                           ("slowest quarter", ordered[len(ordered) - max(1, len(ordered) // 4):])):
            med = {k: statistics.median(c[k] for c in part) for k in ("ms", *KEYS)}
            print(f"| {side} | {name} ({len(part)}) | {med['ms']:.2f} | " + " | ".join(f"{med[k]:.1f}" for k in KEYS)
                  + " |", flush=True)


if __name__ == "__main__":
    main()
