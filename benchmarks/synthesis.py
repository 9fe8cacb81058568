"""Synthesis benchmark: a table per preset: the bound, the synthesized plan, ring and tree (all simulated), and the
generation time (of the packing plan, or of the shared-rate packing where that is the plan chosen); prints a
markdown table (the one in docs/synthesis.md). With --generation, only what generating
the packing plan costs, part by part (the "Generation time" table).

    PYTHONPATH=. python benchmarks/synthesis.py [--boxes 1 2 4] [--presets dgx-h100 ...] [--sizes 1KiB ... 1GiB]
    PYTHONPATH=. python benchmarks/synthesis.py --generation --presets dgx-h100 --boxes 2
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time

from jaxcoll.synth import evaluate, lower_bound
from jaxcoll.synth.packing import chunk_cap, forest
from jaxcoll.synth.select import packings, plan_named
from jaxcoll.topology import preset

SIZES = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_size(text: str) -> int:
    for unit, mult in SIZES.items():
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * mult)
    return int(text)


def human(nbytes: int) -> str:
    for unit, mult in reversed(SIZES.items()):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult} {unit}"
    return f"{nbytes} B"


def algbw(size: float, seconds: float) -> float:
    return size / seconds / 1e9


RINGS = ("ring", "ring2")
TREES = ("tree1", "tree4", "tree16")


def all_reduce_ratio(topology, size: int) -> float:
    """Simulated time of the better of ring and tree over that of the synthesized all_reduce (>= 1: not slower)."""
    cands = evaluate(topology, "all_reduce", size)
    base = min(c.seconds for c in cands if c.name in RINGS + TREES)
    return base / cands[0].seconds


def generation_seconds(name: str, boxes: int, collective: str, repeat: int, plan: str = "forest") -> float:
    """Median time to build the packing plan (or the one named) from a fresh topology (routes, packing,
    rounding, plan IR)."""
    times = []
    for _ in range(repeat):
        t = preset(name, boxes)  # a new object: nothing cached
        gc.collect()  # the previous run's plans go now, not inside the timing
        t0 = time.perf_counter()
        plan_named(t, collective, plan)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def generation_parts(name: str, boxes: int, collective: str, repeat: int) -> dict[str, float]:
    """Medians over `repeat` fresh topologies: the whole generation (wall and process time), then its parts in
    process time, each run on its own: routes and packing LP, rounding to whole chunks, building the plan."""
    runs: dict[str, list[float]] = {}
    for _ in range(repeat):
        t = preset(name, boxes)
        gc.collect()  # the previous run's plans go now, not inside the timing
        w0, c0 = time.perf_counter(), time.process_time()
        plan, _ = plan_named(t, collective, "forest")
        parts = {"wall": time.perf_counter() - w0, "process": time.process_time() - c0,
                 "steps": plan.num_steps()}
        del plan
        t = preset(name, boxes)
        gc.collect()
        c0 = time.process_time()
        out, inward = packings(t)
        c1 = time.process_time()
        k = chunk_cap(t.nranks)
        for packing, needed in ((out, collective != "reduce_scatter"), (inward, collective != "all_gather")):
            if needed:
                packing.counts(k)
        c2 = time.process_time()
        built = forest(t, collective, None, (out, inward))
        c3 = time.process_time()
        del built  # freed after the timing, as the plan_named run's plan
        parts.update({"routes + LP": c1 - c0, "rounding": c2 - c1, "plan": c3 - c2})
        for key, value in parts.items():
            runs.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in runs.items()}


def generation_table(args) -> None:
    print("| topology | collective | plan steps | wall s | process s | routes + packing LP | rounding | "
          "plan (tree_plan) | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.presets:
        for boxes in args.boxes:
            for coll in ("all_gather", "reduce_scatter", "all_reduce"):
                p = generation_parts(name, boxes, coll, args.repeat)
                print(f"| {preset(name, boxes).name} | {coll} | {p['steps']:.0f} | {p['wall']:.2f} | "
                      f"{p['process']:.2f} | {p['routes + LP']:.2f} | {p['rounding']:.2f} | {p['plan']:.2f} | "
                      f"{os.getloadavg()[0]:.1f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="+", default=["dgx1", "dgx2", "dgx-a100", "dgx-h100", "mi250"])
    ap.add_argument("--boxes", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--sizes", nargs="+", help="all_reduce sizes (default: 1 KiB to 1 GiB in steps of 8x)",
                    default=["1KiB", "8KiB", "64KiB", "512KiB", "4MiB", "32MiB", "256MiB", "1GiB"])
    ap.add_argument("--te-ccl", action="store_true", help="add TE-CCL's two-box DGX-2 model")
    ap.add_argument("--repeat", type=int, default=3, help="generation timings per row (the median is printed)")
    ap.add_argument("--generation", action="store_true", help="only the generation time, part by part")
    args = ap.parse_args()
    if args.generation:
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"Python {platform.python_version()}; seconds, medians of {args.repeat}; load: 1-minute average\n")
        generation_table(args)
        return
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; load (1-minute average) {os.getloadavg()[0]:.1f} at the start\n")
    tops = [(p, b) for p in args.presets for b in args.boxes] + ([("te-ccl-dgx2", 2)] if args.te_ccl else [])
    sizes = [parse_size(x) for x in args.sizes]
    big = 1 << 30
    for name, boxes in tops:
        t = preset(name, boxes)
        print(f"### {t.name} ({t.nranks} ranks), 1 GiB\n")
        print("| collective | bound GB/s | synthesized GB/s (plan) | % of bound | ring GB/s | tree GB/s | "
              f"gen s (median of {args.repeat}) | all_reduce: worst ratio best(ring, tree) / synthesized, 1 KiB-1 GiB |")
        print("|---|---|---|---|---|---|---|---|")
        for coll in ("all_gather", "reduce_scatter", "all_reduce"):
            cands = evaluate(t, coll, big)
            best = cands[0]
            # the packing's generation; the shared-rate one's where it is the plan chosen
            gen = generation_seconds(name, boxes, coll, args.repeat,
                                     best.name if best.name == "forest-shared" else "forest")
            by = {c.name: c for c in cands}
            ring_s = min((by[n].seconds for n in RINGS if n in by), default=None)
            tree_s = min((by[n].seconds for n in TREES if n in by), default=None)
            bound = lower_bound(t, coll, big)
            ratio = ""
            if coll == "all_reduce":
                worst = min((all_reduce_ratio(t, s), s) for s in sizes)
                ratio = f"{worst[0]:.2f}x (at {human(worst[1])})"
            fmt = (lambda s: f"{algbw(big, s):.1f}" if s else "-")
            print(f"| {coll} | {algbw(big, bound):.1f} | {algbw(big, best.seconds):.1f} ({best.name}) | "
                  f"{100 * bound / best.seconds:.2f}% | {fmt(ring_s)} | {fmt(tree_s)} | {gen:.2f} | {ratio} |",
                  flush=True)
        print()


if __name__ == "__main__":
    main()
