"""The `jaxcoll` command line (`python -m jaxcoll ...`). Each subcommand is a module of this package with
`add_parser(subparsers)` and `run(args) -> int`; this file only dispatches."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module under jaxcoll.cli; imported only when chosen, so `jaxcoll synth` never loads JAX.
SUBCOMMANDS = {
    "bench": "jaxcoll.cli.bench",
    "synth": "jaxcoll.cli.synth",
    "topo": "jaxcoll.cli.topo",
    "plan": "jaxcoll.cli.plan",
    "tune": "jaxcoll.cli.tune",
    "trace": "jaxcoll.cli.trace",
}

EXAMPLES = """examples (COMMAND --help for each command's options and defaults):
  jaxcoll bench --collectives all_reduce --sizes 64K,16M
  jaxcoll synth --topology dgx-h100 --size 64MiB --out plan.json
  jaxcoll plan show plan.json --bytes 64MiB -o plan.png
  jaxcoll trace show trace.json --out lanes.png
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="jaxcoll", description="jaxcoll: collectives for JAX", epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    wanted = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for name, modname in SUBCOMMANDS.items():
        if wanted not in (None, name):
            sub.add_parser(name)
            continue
        try:
            modules[name] = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name != modname:
                raise
            continue
        modules[name].add_parser(sub)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(modules[args.command].run(args) or 0)
