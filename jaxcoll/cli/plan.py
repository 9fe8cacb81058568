"""`jaxcoll plan`: look at and check plan files (a jaxcoll plan JSON, or an MSCCL XML algorithm).

    jaxcoll plan show FILE [-o picture.png|.svg] [--bytes N]   summary, and a picture if -o is given
    jaxcoll plan check FILE                                     prove it (jaxcoll.lang.check)
    jaxcoll plan convert FILE -o OUT.xml|OUT.json|OUT.mscclpp.json
"""

from __future__ import annotations

import sys


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="show, check or convert a plan file")
    sub = p.add_subparsers(dest="plan_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print a summary and draw ranks x time (PNG or SVG)")
    show.add_argument("file", help="a jaxcoll plan .json or an MSCCL .xml")
    show.add_argument("-o", "--output", help="picture to write (.png or .svg)")
    show.add_argument("--bytes", type=int, default=1 << 20, help="input bytes per rank for the link summary")
    chk = sub.add_parser("check", help="prove the plan computes its collective without deadlock or race")
    chk.add_argument("file")
    conv = sub.add_parser("convert", help="write the plan as MSCCL XML (.xml), MSCCL++ JSON (.mscclpp.json) "
                                          "or jaxcoll JSON (.json)")
    conv.add_argument("file")
    conv.add_argument("-o", "--output", required=True)


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
        plan = load(args.file)
        if args.plan_command == "show":
            from jaxcoll.lang.picture import draw, summary
            print(summary(plan, args.bytes))
            if args.output:
                draw(plan, args.output)
                print(f"wrote {args.output}")
        elif args.plan_command == "check":
            check(plan)
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
    return 0
