"""`jaxcoll trace`: read the step traces that `jaxcoll.trace` and `JAXCOLL_TRACE=path` write.

    jaxcoll trace show FILE [FILE...] [--out lanes.png]   summary per rank, and a picture of the lanes over time
"""

from __future__ import annotations

from jaxcoll.cli.console import HelpFormatter

EXAMPLES = """examples:
  JAXCOLL_TRACE=trace.json python train.py
  jaxcoll trace show trace.json --out lanes.png
  jaxcoll trace show trace.json --call 1 --no-arrivals --out call1.png   (one call's steps)
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
    show.add_argument("--no-arrivals", action="store_true",
                      help="draw the lanes only, without each rank's wait for its peers to arrive")
    show.add_argument("--call", type=int, metavar="K",
                      help="only the K-th call traced (from 0, in the order the calls started; in each file)")


def run(args) -> int:
    from jaxcoll.observe import trace_events, trace_show
    events = trace_events.load(args.files)
    if args.call is not None:
        events = trace_show.one_call(events, args.call)
    print(trace_show.summary(events))
    if args.out:
        if not events:
            print(f"nothing to draw: {', '.join(args.files)} hold no steps")
            return 1
        what = "" if args.call is None else f", call {args.call}"
        if args.no_arrivals:
            events = [e for e in events if e["name"] != trace_events.ARRIVAL_NAME]
        trace_show.draw(events, args.out, title=f"jaxcoll trace: {', '.join(args.files)}{what}")
        print(f"wrote {args.out}")
    return 0
