"""jaxcoll across processes against XLA's cross-process (gloo) collectives, over several runs of
`python -m jaxcoll bench --processes P` per transport (docs/benchmarks.md, "Across processes").

Each run is one `jaxcoll bench` job (its own processes, jaxcoll and gloo alternating call by call after the
warm-up); this script runs it `--runs` times per transport and prints, per collective and size, the median over
the runs of each run's median time, the median speedup and the range of the runs' speedups (how far one run can be
trusted on a shared machine), and the copy bandwidth each run measured. `--markdown` writes the tables, `--plot`
draws busbw against size for both sides and both transports.

    python benchmarks/multiprocess.py --runs 3 --markdown /tmp/mp.md --plot docs/benchmarks-multiprocess.png
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

from jaxcoll.cli.bench import MARKDOWN_ROW

TRANSPORTS = {"shm": {}, "tcp": {"JAXCOLL_TRANSPORT": "tcp"}}
TITLE = re.compile(r"^### (\w+) \(jaxcoll algorithm=(\S+)\) vs XLA$")
BANDWIDTH = re.compile(r"copy bandwidth ([\d.]+) GB/s")


def run_once(transport: str, args) -> tuple[float, dict]:
    """One bench job: (copy bandwidth GB/s, {(collective, algorithm, size): (ours_us, busbw, traffic GB/s, xla_us,
    xla_busbw)})."""
    with tempfile.NamedTemporaryFile(suffix=".md") as md:
        cmd = [sys.executable, "-m", "jaxcoll", "bench", "--processes", str(args.processes), "--sizes", args.sizes,
               "--collectives", args.collectives, "--algorithms", args.algorithms, "--reps", str(args.reps),
               "--markdown", md.name]
        done = subprocess.run(cmd, env={**os.environ, **TRANSPORTS[transport]}, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed ({transport}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        text = open(md.name).read()
    bw = float(BANDWIDTH.search(text).group(1))
    cells, where = {}, None
    for line in text.splitlines():
        if m := TITLE.match(line):
            where = (m.group(1), m.group(2))
        elif (m := MARKDOWN_ROW.match(line)) and where:
            size, ours, _, _, bus, traffic, xla, _, _, xbus, *_ = m.groups()
            cells[(*where, size)] = (float(ours), float(bus), float(traffic), float(xla), float(xbus))
    return bw, cells


def summarize(transport: str, runs: list[tuple[float, dict]]) -> tuple[list[str], dict]:
    """Markdown lines for one transport and {(collective, algorithm): [(size, ours_busbw, xla_busbw)]}."""
    bws = [bw for bw, _ in runs]
    lines = [f"## {transport}: median of {len(runs)} runs (copy bandwidth {min(bws):.1f}-{max(bws):.1f} GB/s)", ""]
    series: dict = {}
    keys = list(runs[0][1])
    for collective, algorithm in dict.fromkeys((c, a) for c, a, _ in keys):
        lines += [f"#### {collective} (jaxcoll algorithm={algorithm}) vs gloo, {transport}", "",
                  "| size/rank | jaxcoll us | busbw GB/s | traffic GB/s | gloo us | busbw GB/s | speedup | per run |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c, a, size in keys:
            if (c, a) != (collective, algorithm):
                continue
            cells = [r[(c, a, size)] for _, r in runs if (c, a, size) in r]
            med = [statistics.median(v[i] for v in cells) for i in range(5)]
            speedups = [v[3] / v[0] for v in cells]
            lines.append(f"| {size} | {med[0]:.1f} | {med[1]:.2f} | {med[2]:.2f} | {med[3]:.1f} | {med[4]:.2f} | "
                         f"{statistics.median(speedups):.2f}x | {min(speedups):.2f}-{max(speedups):.2f}x |")
            series.setdefault((c, a), []).append((size, med[1], med[4]))
        lines.append("")
    return lines, series


def plot(series_by_transport: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pairs = sorted({k for s in series_by_transport.values() for k in s})
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.5 * len(pairs), 3.8), squeeze=False)
    for ax, (collective, algorithm) in zip(axes[0], pairs):
        for transport, series in series_by_transport.items():
            points = series.get((collective, algorithm), [])
            sizes = [p[0] for p in points]
            ax.plot(sizes, [p[1] for p in points], "o-", label=f"jaxcoll {transport}")
            ax.plot(sizes, [p[2] for p in points], "x--", label=f"gloo ({transport} run)")
        ax.set_title(f"{collective} ({algorithm})")
        ax.set_xlabel("size per rank")
        ax.set_ylabel("busbw GB/s")
        ax.tick_params(axis="x", rotation=45)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument("--sizes", default="4K,64K,1M,4M,16M")
    p.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter,all_to_all")
    p.add_argument("--algorithms", default="auto")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--markdown")
    p.add_argument("--plot")
    args = p.parse_args(argv)
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in TRANSPORTS]
    if bad or args.runs < 1:
        p.error(f"--transports must name {sorted(TRANSPORTS)} (got {bad}) and --runs must be >= 1 "
                f"(got {args.runs})")
    out, series = [], {}
    for t in transports:
        runs = []
        for i in range(args.runs):
            runs.append(run_once(t, args))
            print(f"{t}: run {i + 1} of {args.runs} done (copy bandwidth {runs[-1][0]:.1f} GB/s)", flush=True)
        lines, series[t] = summarize(t, runs)
        out += lines
    text = "\n".join(out)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.plot:
        plot(series, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
