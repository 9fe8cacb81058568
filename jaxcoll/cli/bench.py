"""`jaxcoll bench`: nccl-tests style comparison of jaxcoll's collectives with XLA's own, on the same devices.

Each measurement is one jitted shard_map program that runs the collective `iters` times back to back inside a
fori_loop (the carry feeds each call, so XLA can neither hoist nor merge them), timed per program call and
divided by `iters`, as nccl-tests times back-to-back iterations; from 1 MiB up `iters` is 1, one collective per
launch (see `jaxcoll.tune.measure.iterations`). jaxcoll and XLA programs alternate call by call
in one run, so both see the same machine state, after `--warmup` untimed calls of each (nccl-tests' -w); the
tables quote medians with the least and the most of the `--reps` calls ("min-max"), the ratio of the medians
("speedup") and the range of the ratios of each pair of alternating calls ("per pair"). A spread as wide as the
difference between the sides means one run cannot tell them apart: run it again. Other work competing for the
cores is warned about: a load average above the core count before the run, other processes' share of the CPU time
above a quarter during it.

Bandwidths follow nccl-tests: busbw = S / t * 2(N-1)/N for all_reduce and S / t * (N-1)/N for the others, with S
the per-rank input bytes (the gathered output for all_gather). "traffic GB/s" is the bytes a call must at least
read and write (every input read once, every output written once) over its time: compare it with the memory copy
bandwidth in the heading (read+write, all cores, 256 MiB buffers). A call whose data stays in the caches can pass
that bandwidth; from a few MiB per rank up it is the ceiling.

examples:
  jaxcoll bench                                              every collective, 4 KiB to 64 MiB per rank
  jaxcoll bench --collectives all_reduce --sizes 64K,16M --reps 15
  jaxcoll bench --algorithms direct,ring --plot busbw.png --markdown bench.md
  jaxcoll bench --processes 2                                across 2 processes, against XLA's gloo
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import threading
import time

SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
# A row of the --markdown tables, as benchmarks/multiprocess.py reads it back: size, jaxcoll's median, min, max,
# busbw, traffic; XLA's median, min, max, busbw; the speedup of the medians, the least and the most per pair.
MARKDOWN_ROW = re.compile(r"^\| ([\d.]+ [KMG]?i?B) \| ([\d.]+) \| ([\d.]+)-([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) "
                          r"\| ([\d.]+)-([\d.]+) \| ([\d.]+) \| ([\d.]+)x \| ([\d.]+)-([\d.]+)x \|$", re.M)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def add_parser(sub) -> None:
    from jaxcoll.cli.console import HelpFormatter
    p = sub.add_parser("bench", help="compare jaxcoll's collectives with XLA's on this machine's devices",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma-separated")
    p.add_argument("--sizes", default=SIZES, help="per-rank input sizes, comma-separated")
    p.add_argument("--devices", type=int, default=8,
                   help="CPU devices to emulate when on CPU, in all processes together")
    p.add_argument("--processes", type=_at_least(1), default=1,
                   help="run as a jax.distributed job of this many processes on this machine, the devices split "
                        "evenly among them; XLA's side is then its cross-process collectives (gloo)")
    p.add_argument("--dtype", default="float32", help="element type of the buffers")
    p.add_argument("--reps", type=_at_least(1), default=7, help="timed program calls per side and size")
    p.add_argument("--warmup", type=_at_least(0), default=5,
                   help="untimed program calls per side and size after compiling, as nccl-tests' -w")
    p.add_argument("--algorithms", default="auto",
                   help="jaxcoll algorithms to time, comma-separated, e.g. direct,two_shot,ring")
    p.add_argument("--plot", metavar="PNG", help="also draw busbw against size to this file")
    p.add_argument("--markdown", metavar="MD", help="also write the tables as markdown to this file")


def _at_least(low: int):
    def count(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return count


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def format_size(n: int) -> str:
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= s and n % s == 0:
            return f"{n // s} {unit}"
    return f"{n} B"


def copy_bandwidth(nbytes: int = 256 << 20, threads: int | None = None) -> float:
    """Bytes read plus written per second by plain copies on all cores at once (numpy releases the GIL)."""
    import numpy as np

    threads = threads or os.cpu_count() or 1
    src = [np.ones(nbytes // threads, np.uint8) for _ in range(threads)]
    dst = [np.empty_like(s) for s in src]

    def work(i):
        np.copyto(dst[i], src[i])

    best = float("inf")
    for _ in range(5):
        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def min_traffic(collective: str, n: int, s: int) -> int:
    """Bytes every group-wide call must at least read and write, with s the per-rank input bytes."""
    return {"all_reduce": 2 * n * s, "all_gather": n * s + n * n * s,
            "reduce_scatter": n * s + s, "all_to_all": 2 * n * s}[collective]


def bus_factor(collective: str, n: int) -> float:
    return 2 * (n - 1) / n if collective == "all_reduce" else (n - 1) / n


def _launch_job(args) -> int:
    """Run this benchmark as a job of `args.processes` processes and print process 0's tables. The copy
    bandwidth is measured here first, on every core, while no process of the job runs."""
    import sys

    from jaxcoll import launch
    from jaxcoll.cli.console import busy_meanwhile, cpu_clock, with_progress

    if args.devices % args.processes:
        raise SystemExit(f"jaxcoll bench: --devices={args.devices} does not split evenly over "
                         f"--processes={args.processes}")
    env = {_COPY_BW: repr(copy_bandwidth())}
    clock = cpu_clock()
    results = with_progress(
        lambda: launch.launch(args.processes, ["-m", "jaxcoll", *sys.argv[1:]],
                              local_devices=args.devices // args.processes, env=env, timeout_s=3600),
        f"running the job of {args.processes} processes (process 0 prints its tables when it ends)")
    print(results[0].stdout, end="")
    busy = busy_meanwhile(clock)  # the job's processes are this one's children, waited for: not other work
    if busy:
        print(f"warning: {busy}")
    failed = [r for r in results if r.returncode != 0]
    for r in failed:
        print(f"process {r.process} exited with {r.returncode}:\n{r.stderr[-3000:]}", file=sys.stderr)
    return 1 if failed else 0


_COPY_BW = "JAXCOLL_BENCH_COPY_BW"


def copy_bandwidth_setting() -> float:
    """JAXCOLL_BENCH_COPY_BW (bytes/s; what a job's launcher measured for its processes), else measured now."""
    value = os.environ.get(_COPY_BW, "")
    if not value:
        return copy_bandwidth()
    try:
        bw = float(value)
    except ValueError:
        bw = float("nan")
    if not (math.isfinite(bw) and bw > 0):
        raise SystemExit(f"jaxcoll bench: {_COPY_BW}={value!r} is not a bandwidth in bytes/s (a number above 0); "
                         "unset it to measure the bandwidth")
    return bw


def run(args) -> int:
    from jaxcoll import launch
    from jaxcoll.tune import measure

    if args.processes > 1 and not launch.in_job():
        return _launch_job(args)
    import jax

    process = 0
    if launch.in_job():
        process, _ = launch.initialize()
    else:
        # Emulated CPU devices; takes effect only if no backend has started yet, and leaves real GPUs alone.
        jax.config.update("jax_num_cpu_devices", args.devices)
    import numpy as np
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from jaxcoll.cli.console import busy_machine, busy_meanwhile, cpu_clock

    console = Console(width=None if Console().is_terminal else 160, quiet=process != 0)
    devices = jax.devices()
    n = len(devices)
    mesh = jax.sharding.Mesh(np.array(devices), ("i",))
    dtype = np.dtype(args.dtype)
    collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    bw = copy_bandwidth_setting()
    where = f"{n} x {devices[0].platform} devices" + (
        f" in {jax.process_count()} processes (XLA: {_xla_cross_process()})" if jax.process_count() > 1 else "")
    console.print(f"[bold]jaxcoll bench[/]: {where}, {os.cpu_count()} cores, "
                  f"dtype {dtype.name}; memory copy bandwidth {bw / 1e9:.1f} GB/s (read+write, all cores)")
    from jaxcoll import algorithms as builtins
    unknown = [a for a in algorithms if not any(a in builtins.known(c) for c in collectives)]
    if unknown:
        raise SystemExit(f"jaxcoll bench: --algorithms {','.join(unknown)} is not an algorithm of "
                         f"{', '.join(collectives)}; known: " +
                         "; ".join(f"{c}: {', '.join(builtins.known(c))}" for c in collectives))
    busy = busy_machine()
    if busy:
        console.print(f"[yellow]warning: {busy}[/]")
    clock = cpu_clock()
    console.print(f"medians of {args.reps} timed calls a side (after {args.warmup} untimed); min-max: the least and "
                  "the most; per pair: XLA's time over jaxcoll's for each pair of calls")
    cells = [(c, a) for c in collectives for a in algorithms if a in builtins.known(c)]
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True)
    task = progress.add_task("", total=len(cells) * len(sizes))
    rows_md, plot = [], {}
    with progress:
        for collective in collectives:
            skipped = [a for a in algorithms if a not in builtins.known(collective)]
            if skipped:  # a list covering several collectives names algorithms only some of them have
                console.print(f"{collective}: no algorithm {', '.join(skipped)} (skipped)")
            for algorithm in (a for a in algorithms if a not in skipped):
                title = f"{collective} (jaxcoll algorithm={algorithm}) vs XLA"
                table = Table(title=title)
                for col in ("size/rank", "iters", "jaxcoll us", "min-max", "busbw GB/s", "traffic GB/s",
                            "XLA us", "min-max", "busbw GB/s", "speedup", "per pair"):
                    table.add_column(col, justify="right")
                md = [f"### {title}", "",
                      "| size/rank | jaxcoll us | min-max | busbw GB/s | traffic GB/s | XLA us | min-max | busbw GB/s "
                      "| speedup | per pair |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
                for s in sizes:
                    count = max(n, s // dtype.itemsize // n * n)
                    nbytes = count * dtype.itemsize
                    progress.update(task, description=f"{collective} {format_size(nbytes)}: compiling")
                    times = _time(collective, mesh, n, count, dtype, algorithm, args,
                                  lambda: progress.update(task, description=f"{collective} {format_size(nbytes)}: "
                                                                            f"timing {args.reps} calls a side"))
                    progress.advance(task)
                    t_ours, t_xla = statistics.median(times["ours"]), statistics.median(times["xla"])
                    algbytes = nbytes * n if collective == "all_gather" else nbytes
                    bus = [algbytes / t / 1e9 * bus_factor(collective, n) for t in (t_ours, t_xla)]
                    traffic = min_traffic(collective, n, nbytes) / t_ours / 1e9
                    pairs = [x / o for o, x in zip(times["ours"], times["xla"])]
                    row = [f"{t_ours * 1e6:.1f}", _spread(times["ours"]), f"{bus[0]:.2f}", f"{traffic:.2f}",
                           f"{t_xla * 1e6:.1f}", _spread(times["xla"]), f"{bus[1]:.2f}", f"{t_xla / t_ours:.2f}x",
                           f"{min(pairs):.2f}-{max(pairs):.2f}x"]
                    table.add_row(format_size(nbytes), str(measure.iterations(nbytes)), *row)
                    md.append(f"| {format_size(nbytes)} | " + " | ".join(row) + " |")
                    plot.setdefault((collective, algorithm), []).append((nbytes, bus[0], bus[1]))
                console.print(table)
                rows_md += md + [""]
    busy = None if launch.in_job() else busy_meanwhile(clock)  # a job's peers are no other work; its launcher checks
    if busy:
        console.print(f"[yellow]warning: {busy}[/]")
    if args.markdown and process == 0:
        with open(args.markdown, "w") as f:
            f.write(f"{where}, {os.cpu_count()} cores, dtype {dtype.name}, copy bandwidth {bw / 1e9:.1f} GB/s, "
                    f"load average {os.getloadavg()[0]:.1f}\n\n" + "\n".join(rows_md))
        console.print(f"wrote {args.markdown}")
    if args.plot and process == 0:
        _plot(plot, args.plot, n)
        console.print(f"wrote {args.plot}")
    return 0


def _time(collective, mesh, n, count, dtype, algorithm, args, timing) -> dict[str, list[float]]:
    """Seconds per collective of `args.reps` calls of each side, alternating; `timing()` is called when the
    compiled and warmed-up programs start to be timed."""
    import jax
    import numpy as np

    from jaxcoll.tune import measure

    iters = measure.iterations(count * dtype.itemsize)
    ours, xla = (measure.program(collective, mesh, "i", iters, a) for a in (algorithm, "xla"))
    x = jax.make_array_from_callback((n * count,), jax.NamedSharding(mesh, jax.P("i")),
                                     lambda index: np.full(n * count, 1e-3, dtype)[index])
    # Compile both before timing either, then warm up: a new program's first calls fault in fresh pages
    # (outputs, the executor's per-call-site state, XLA's buffers) and run 2-3x slower.
    for _ in range(1 + args.warmup):
        jax.block_until_ready((ours(x), xla(x)))
    timing()
    times = {"ours": [], "xla": []}
    for _ in range(args.reps):
        for side, f in (("ours", ours), ("xla", xla)):
            t0 = time.perf_counter()
            jax.block_until_ready(f(x))
            times[side].append((time.perf_counter() - t0) / iters)
    return times


def _spread(seconds: list[float]) -> str:
    """The least and the most of `seconds`, in microseconds, as short as the table needs (whole ones, rounded
    outwards, from 100 up)."""
    lo, hi = min(seconds) * 1e6, max(seconds) * 1e6
    return f"{lo:.1f}-{hi:.1f}" if hi < 100 else f"{math.floor(lo)}-{math.ceil(hi)}"


def _xla_cross_process() -> str:
    import jax
    return f"{jax.config.jax_cpu_collectives_implementation or 'gloo'} collectives"


def _plot(series, path, n) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = sorted({c for c, _ in series})
    fig, axes = plt.subplots(1, len(collectives), figsize=(4.5 * len(collectives), 3.6), squeeze=False)
    for ax, collective in zip(axes[0], collectives):
        xla_drawn = False
        for (c, algorithm), pts in series.items():
            if c != collective:
                continue
            sizes = [p[0] for p in pts]
            ax.plot(sizes, [p[1] for p in pts], "o-", label=f"jaxcoll {algorithm}")
            if not xla_drawn:
                ax.plot(sizes, [p[2] for p in pts], "s--", color="gray", label="XLA")
                xla_drawn = True
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{collective}, {n} ranks")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
