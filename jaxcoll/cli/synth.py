"""`jaxcoll synth`: synthesize a plan for a topology and print how it compares with the bound, ring and tree."""

from __future__ import annotations

import os
import sys
import time

from jaxcoll.cli.console import HelpFormatter, with_progress
from jaxcoll.plan import Collective

SIZE_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9, "B": 1}


def parse_size(text: str) -> int:
    for unit in sorted(SIZE_UNITS, key=len, reverse=True):
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * SIZE_UNITS[unit])
    return int(text)


EXAMPLES = """examples:
  jaxcoll synth --topology dgx-h100                        all_reduce of 1 GiB on one DGX H100
  jaxcoll synth --topology dgx1 --collective all_gather --size 64KiB --out ag.json
  jaxcoll synth --topology dgx-h100 --boxes 2 --collective reduce_scatter --size 64MiB
  jaxcoll synth --topology my-topology.json                a topology from `jaxcoll topo import`
"""


def add_parser(subparsers) -> None:
    from jaxcoll.topology.presets import PRESETS
    p = subparsers.add_parser("synth", help="synthesize a plan for a topology", epilog=EXAMPLES,
                              formatter_class=HelpFormatter,
                              description="Synthesize the plan with the best simulated time and compare it with "
                                          "the bound, ring and tree.")
    p.add_argument("--topology", required=True,
                   help=f"a preset name ({', '.join(PRESETS)}) or a topology JSON file")
    p.add_argument("--boxes", type=int, default=1,
                   help="boxes of the preset joined by the network (ignored for cpu and for a JSON file)")
    p.add_argument("--collective", default="all_reduce", choices=["all_gather", "reduce_scatter", "all_reduce"],
                   help="the collective to synthesize")
    p.add_argument("--size", default="1GiB", help="nccl-tests size S, e.g. 1GiB, 64MiB, 4096")
    p.add_argument("--out", help="write the plan: .json (jaxcoll plan) or .xml (MSCCL)")


def load_topology(spec: str, boxes: int):
    from jaxcoll.topology import Topology, preset
    if os.path.exists(spec):
        return Topology.load(spec)
    return preset(spec, boxes)


def run(args) -> int:
    from jaxcoll.synth import evaluate, lower_bound
    from jaxcoll.topology import TopologyError
    try:
        topo = load_topology(args.topology, args.boxes)
        size = parse_size(args.size)
    except (TopologyError, ValueError) as e:
        print(f"jaxcoll synth: {e}", file=sys.stderr)
        return 2
    coll = Collective(args.collective)
    t0 = time.perf_counter()
    cands = with_progress(lambda: evaluate(topo, coll, size), f"synthesizing {coll.value} for {topo.name}")
    gen = time.perf_counter() - t0
    best = cands[0]
    n = topo.nranks
    factor = 2 * (n - 1) / n if coll is Collective.ALL_REDUCE else (n - 1) / n

    def line(label, seconds):
        alg = size / seconds / 1e9
        return f"  {label:<22} {seconds * 1e6:12.1f} us  algbw {alg:9.2f} GB/s  busbw {alg * factor:9.2f} GB/s"

    bound = lower_bound(topo, coll, size)
    plan = best.plan
    print(f"{topo.name}: {n} ranks, {coll.value} of {size} bytes")
    print(f"chosen plan: {plan.name} ({plan.num_steps()} steps, chunk factor {plan.chunk_factor}, "
          f"{max(len(p.lanes) for p in plan.ranks)} lanes max per rank); generated and compared in {gen:.2f} s")
    print(line("chosen", best.seconds) + f"  ({100 * bound / best.seconds:.1f}% of bound)")
    print(line("bound", bound))
    by = {c.name: c for c in cands}
    for label, names in (("ring", ("ring", "ring2")), ("tree", ("tree1", "tree4", "tree16"))):
        got = [by[x] for x in names if x in by]
        if got:
            c = min(got, key=lambda c: c.seconds)
            print(line(f"{label} ({c.name})", c.seconds))
    if args.out:
        try:
            with_progress(lambda: save(plan, args.out), f"writing {args.out} ({plan.num_steps()} steps)")
        except OSError as e:
            print(f"jaxcoll synth: {e.filename or args.out}: {e.strerror or e}", file=sys.stderr)
            return 1
        print(f"wrote {args.out}; see it with: jaxcoll plan show {args.out} --bytes {args.size}")
    return 0


def save(plan, path: str) -> None:
    """Write `plan` as MSCCL XML (a .xml path) or as a jaxcoll plan JSON."""
    if path.endswith(".xml"):
        from jaxcoll.lang.msccl import to_msccl_xml
        with open(path, "w") as f:
            f.write(to_msccl_xml(plan))
    else:
        plan.save(path)
