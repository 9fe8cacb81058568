"""`jaxcoll topo`: show a topology (summary, or a drawing to PNG), or read `nvidia-smi topo -m` output."""

from __future__ import annotations

import sys

from jaxcoll.cli.console import HelpFormatter


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("topo", help="show or import topologies")
    sub = p.add_subparsers(dest="topo_command", metavar="ACTION")
    show = sub.add_parser("show", help="summarize a topology; --out draws it to PNG", formatter_class=HelpFormatter)
    show.add_argument("--topology", required=True, help="preset name or topology JSON file")
    show.add_argument("--boxes", type=int, default=1,
                      help="boxes of the preset joined by the network (ignored for cpu and for a JSON file)")
    show.add_argument("--out", help="PNG file to draw the topology into")
    imp = sub.add_parser("import", help="convert `nvidia-smi topo -m` output to a topology JSON file",
                         formatter_class=HelpFormatter)
    imp.add_argument("input", help="file with the text of `nvidia-smi topo -m` (- for stdin)")
    imp.add_argument("--out", required=True, help="topology JSON file to write")
    imp.add_argument("--nvlink-GBps", type=float, default=25.0, help="bandwidth of one NVLink, GB/s each way")


def run(args) -> int:
    from jaxcoll.cli.synth import load_topology
    from jaxcoll.topology import TopologyError, parse_nvidia_smi_topo
    try:
        if args.topo_command == "import":
            text = sys.stdin.read() if args.input == "-" else open(args.input).read()
            topo = parse_nvidia_smi_topo(text, nvlink_GBps=args.nvlink_GBps)
            topo.save(args.out)
            print(f"{topo!r} -> {args.out}")
            return 0
        if args.topo_command != "show":
            print("jaxcoll topo: choose an action: show or import", file=sys.stderr)
            return 2
        topo = load_topology(args.topology, args.boxes)
    except (TopologyError, OSError) as e:
        print(f"jaxcoll topo: {e}", file=sys.stderr)
        return 2
    print(repr(topo))
    for b, box in enumerate(topo.boxes):
        print(f"  box {b}: ranks {list(box)}")
    if args.out:
        from jaxcoll.topology.draw import draw
        draw(topo, args.out)
        print(f"wrote {args.out}")
    return 0
