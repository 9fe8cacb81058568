"""Does the model follow the machine? benchmarks/tuning.py on several machines made from this one (docs/tuning.md,
"It adapts"): one core against two (taskset), 4, 8 and 16 devices in a process, 2 and 4 processes, shared memory
against TCP, and TCP with a slow link (JAXCOLL_NET_DELAY_US). Each configuration is calibrated afresh; the table
puts, per configuration, the calibrated constants that changed, the model's prediction error, and how often auto
(the model's pick, no tuning file) is within 10% of the fastest plan measured in the same run.

    python benchmarks/tuning_adapts.py --sizes 16K,1M --markdown /tmp/adapts.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {
    "8 devices on 2 cores": ([], {}),
    "8 devices on 1 core": (["taskset", "-c", "0"], {}),
    "4 devices": ([], {"--devices": "4"}),
    "16 devices": ([], {"--devices": "16"}),
    "2 processes over shm": ([], {"--processes": "2"}),
    "4 processes over shm": ([], {"--processes": "4"}),
    "2 processes over tcp": ([], {"--processes": "2", "--transport": "tcp"}),
    "2 processes over tcp with a 200 us delay": ([], {"--processes": "2", "--transport": "tcp", "env": "200"}),
}


def run(name: str, prefix, options, args) -> str | None:
    """benchmarks/tuning.py's markdown for one configuration, or None (its error printed) when the run failed."""
    options = dict(options)
    env = {**os.environ, "JAXCOLL_TUNING": "off"}
    if "env" in options:
        env["JAXCOLL_NET_DELAY_US"] = options.pop("env")
    with tempfile.NamedTemporaryFile(suffix=".md") as md:
        cmd = [*prefix, sys.executable, os.path.join(HERE, "tuning.py"), "--sizes", args.sizes, "--reps",
               str(args.reps), "--collectives", args.collectives, "--markdown", md.name,
               *[x for kv in options.items() for x in kv]]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            print(f"{name}: benchmarks/tuning.py exited with {done.returncode}:\n{done.stderr[-2000:]}",
                  file=sys.stderr, flush=True)
            return None
        return open(md.name).read()


def summary(name: str, text: str) -> str:
    model = re.search(r"model: `(\{.*\})`", text)
    constants = json.loads(model.group(1)) if model else {}
    err = re.search(r"median \|error\| (\d+)%, 90th percentile (\d+)%", text)
    within = re.search(r"auto within 10% of the fastest in (\d+) of (\d+) cells", text)
    picks = re.findall(r"^\| (\w+) \| ([\d.]+ [KMG]iB) \| (\S+) \(\w+\) \| [\d.]+ \| (\S+) \| [\d.]+ \| ([\d.]+) \|",
                       text, re.M)
    chosen = "; ".join(f"{c} {s}: {a} (fastest {f}, {r}x)" for c, s, a, f, r in picks)
    return (f"| {name} | {constants.get('call_s', 0) * 1e6:.0f} | {constants.get('helpers_s', 0) * 1e6:.0f} | "
            f"{constants.get('memory_rate', 0) / 1e9:.1f} | {constants.get('crossing_rate', 0) / 1e9:.1f} | "
            f"{constants.get('network_rate', 0) / 1e9:.2f} / {constants.get('network_latency_s', 0) * 1e6:.0f} | "
            f"{err.group(1) if err else '?'}% / {err.group(2) if err else '?'}% | "
            f"{within.group(1) if within else '?'} of {within.group(2) if within else '?'} | {chosen} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="16K,1M")
    p.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names of CONFIGS")
    p.add_argument("--markdown", metavar="MD")
    args = p.parse_args(argv)
    lines = ["| configuration | call us | helpers us | memory GB/s per thread | shm GB/s | network GB/s / latency us "
             "| prediction error median / p90 | auto within 10% | auto's picks |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    details = []
    failed = []
    for name in [c.strip() for c in args.configs.split(",") if c.strip()]:
        prefix, options = CONFIGS[name]
        text = run(name, prefix, options, args)
        if text is None:
            failed.append(name)
            lines.append(f"| {name} | failed |")
            print(lines[-1], flush=True)
            continue
        lines.append(summary(name, text))
        details += [f"## {name}", "", text, ""]
        print(lines[-1], flush=True)
    out = "\n".join(lines) + "\n\n" + "\n".join(details)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
