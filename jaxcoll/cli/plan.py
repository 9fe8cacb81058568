"""`jaxcoll plan`: look at and check plan files (a jaxcoll plan JSON, or an MSCCL XML algorithm).

    jaxcoll plan show FILE [-o picture.png|.svg] [--bytes N]   summary, and a picture if -o is given
    jaxcoll plan check FILE                                     prove it (jaxcoll.lang.check)
    jaxcoll plan convert FILE -o OUT.xml|OUT.json|OUT.mscclpp.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree

from jaxcoll.cli.console import HelpFormatter, with_progress

EXAMPLES = """examples:
  jaxcoll synth --topology dgx1 --collective all_gather --size 64KiB --out ag.json
  jaxcoll plan show ag.json --bytes 64KiB -o ag.png
  jaxcoll plan check ag.json
  jaxcoll plan convert ag.json -o ag.xml
"""


def add_parser(subparsers) -> None:
    from jaxcoll.lang.picture import DETAIL_STEPS
    p = subparsers.add_parser("plan", help="show, check or convert a plan file", epilog=EXAMPLES,
                              formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="plan_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print a summary and draw ranks x time (PNG or SVG)", epilog=EXAMPLES,
                          formatter_class=HelpFormatter,
                          description=f"Print a plan's steps per rank and its traffic per link; -o draws it: one "
                                      f"marker per data step, or a summary picture (steps per rank over time, "
                                      f"traffic per link) for a plan of more than {DETAIL_STEPS} data steps.")
    show.add_argument("file", help="a jaxcoll plan .json or an MSCCL .xml")
    show.add_argument("-o", "--output", help="picture to write (.png or .svg)")
    show.add_argument("--bytes", type=_size, default=None,
                      help="input bytes per rank, e.g. 64KiB, to give each link's traffic in bytes too (a plan serves "
                           "every size; without it, traffic is in multiples of a rank's input)")
    chk = sub.add_parser("check", help="prove the plan computes its collective without deadlock or race",
                         formatter_class=HelpFormatter)
    chk.add_argument("file", help="a jaxcoll plan .json or an MSCCL .xml")
    conv = sub.add_parser("convert", help="write the plan as MSCCL XML (.xml), MSCCL++ JSON (.mscclpp.json) "
                                          "or jaxcoll JSON (.json)", formatter_class=HelpFormatter)
    conv.add_argument("file", help="a jaxcoll plan .json or an MSCCL .xml")
    conv.add_argument("-o", "--output", required=True, help="the file to write; its suffix chooses the format")


def _size(text: str) -> int:
    from jaxcoll.cli.synth import parse_size
    return parse_size(text)


def load(path: str):
    """A plan from a jaxcoll JSON file or an MSCCL XML file (by suffix)."""
    from jaxcoll.plan import Plan
    if path.endswith(".xml"):
        from jaxcoll.lang import load_msccl_xml
        return load_msccl_xml(path)
    return Plan.load(path)


def run(args) -> int:
    from jaxcoll.lang import PlanError, check
    try:
        plan = with_progress(lambda: load(args.file), f"reading {args.file}")
        if args.plan_command == "show":
            from jaxcoll.lang.picture import DETAIL_STEPS, draw, rounds, summary
            when = with_progress(lambda: rounds(plan), f"placing {plan.num_steps()} steps in rounds")
            print(summary(plan, args.bytes, when=when))
            if args.output:
                what = "a summary picture" if len(when) > DETAIL_STEPS else f"{len(when)} data steps"
                kind = with_progress(lambda: draw(plan, args.output, when=when), f"drawing {what} to {args.output}")
                print(f"wrote {args.output}" + (" (a summary picture: too many steps to draw one by one)"
                                                if kind == "summary" else ""))
        elif args.plan_command == "check":
            with_progress(lambda: check(plan), f"checking {plan.num_steps()} steps")
            print(f"{args.file}: proved ({plan.collective.value}, {plan.nranks} ranks, {plan.num_steps()} steps)")
        else:
            out = args.output
            if out.endswith(".mscclpp.json"):
                from jaxcoll.lang import to_mscclpp_json
                text = to_mscclpp_json(plan)
            elif out.endswith(".xml"):
                from jaxcoll.lang import to_msccl_xml
                text = to_msccl_xml(plan)
            else:
                text = plan.dumps()
            with open(out, "w") as f:
                f.write(text)
            print(f"wrote {out}")
    except PlanError as e:
        print(f"{args.file}: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a file missing or unreadable (the plan's, or the one to write); not a closed pipe
        if e.filename is None:
            raise
        print(f"{e.filename}: {e.strerror or e}", file=sys.stderr)
        return 1
    except (json.JSONDecodeError, xml.etree.ElementTree.ParseError) as e:
        print(f"{args.file}: not a plan file: {e}", file=sys.stderr)
        return 1
    return 0
