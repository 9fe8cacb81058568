"""`jaxcoll trace`: read the step traces that `jaxcoll.trace` and `JAXCOLL_TRACE=path` write.

    jaxcoll trace show FILE [FILE...] [--out lanes.png]   summary per rank, and a picture of the lanes over time
"""

from __future__ import annotations

from jaxcoll.cli.console import HelpFormatter

EXAMPLES = """examples:
  JAXCOLL_TRACE=trace.json python train.py
  jaxcoll trace show trace.json --out lanes.png
  jaxcoll trace show trace.p0.json trace.p1.json --out lanes.png   (a job of two processes)
"""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("trace", help="summarise and draw a step trace (jaxcoll.trace)", epilog=EXAMPLES,
                              formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print each rank's time in steps and waits; --out draws the lanes",
                          epilog=EXAMPLES, formatter_class=HelpFormatter,
                          description="Print, per rank, its time in data steps and in waits, its longest wait and "
                                      "how long other ranks waited for it; --out draws every lane over time with "
                                      "the waits marked. Several files (one per process of a job) are shown on "
                                      "one time axis.")
    show.add_argument("files", nargs="+", metavar="FILE", help="trace files written by jaxcoll.trace")
    show.add_argument("--out", "-o", help="picture to write (.png or .svg)")


def run(args) -> int:
    from jaxcoll.observe import trace_events, trace_show
    events = trace_events.load(args.files)
    print(trace_show.summary(events))
    if args.out:
        if not events:
            print(f"nothing to draw: {', '.join(args.files)} hold no steps")
            return 1
        trace_show.draw(events, args.out, title=f"jaxcoll trace: {', '.join(args.files)}")
        print(f"wrote {args.out}")
    return 0
