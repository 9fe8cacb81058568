"""`jaxcoll tune`: calibrate this machine's model, measure the leading plans of each cell, write the tuning file.

Example:
    python -m jaxcoll tune                                   # 8 CPU devices in this process
    python -m jaxcoll tune --processes 2                     # a job of 2 processes over shared memory
    python -m jaxcoll tune --processes 2 --transport tcp     # the same over the network transport
    JAXCOLL_TUNING=/tmp/t.json python -m jaxcoll tune --sizes 64K,1M

"auto" reads the file when its machine, jaxcoll and jax match (docs/tuning.md). The run prints what it chose for
each cell, beside what auto ran without it (the hand-tuned default) and by how much the choice beats it.
"""

from __future__ import annotations

import os
import sys

SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
COLLECTIVES = "all_reduce,all_gather,reduce_scatter"


def add_parser(sub) -> None:
    from jaxcoll.cli.console import HelpFormatter
    p = sub.add_parser("tune", help="measure the fastest plans on this machine and write the tuning file",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--collectives", default=COLLECTIVES, help="comma-separated")
    p.add_argument("--sizes", default=SIZES, help="per-rank input sizes, comma-separated")
    p.add_argument("--devices", type=int, default=8,
                   help="CPU devices, in all processes together")
    p.add_argument("--processes", type=int, default=1,
                   help="tune for a jax.distributed job of this many processes on this machine")
    p.add_argument("--transport", choices=("shm", "tcp"), default="shm",
                   help="between the processes: shared memory, or the network transport")
    p.add_argument("--top", type=int, default=3,
                   help="candidates measured per cell, by the model's ranking, beside the default and any other "
                        "the model predicts within 30%% of its pick (up to 8 in all)")
    p.add_argument("--reps", type=int, default=5, help="timed calls per candidate and cell")
    p.add_argument("--passes", type=int, default=None,
                   help="visit every cell this many times, --reps calls a candidate split among the visits: a "
                        "cell's calls then span the run, not the minute of its turn (default: 3, at most --reps)")
    p.add_argument("--dtype", default="float32", help="element type of the measured calls")
    p.add_argument("--probe-bytes", default="64M",
                   help="largest calibration probe per rank; its footprint should outgrow the caches")
    p.add_argument("--out", metavar="PATH", help="the tuning file to write (default: JAXCOLL_TUNING, else "
                                                 "~/.cache/jaxcoll/tuning.json)")
    p.add_argument("--calibrate-only", action="store_true",
                   help="measure the model's constants and print them; write nothing")


def run(args) -> int:
    from jaxcoll import launch
    from jaxcoll.cli.bench import parse_size

    from jaxcoll.tune.measure import default_passes
    if args.passes is None:
        args.passes = default_passes(args.reps)
    for name in ("devices", "processes", "top", "reps", "passes"):
        if getattr(args, name) < 1:
            raise SystemExit(f"jaxcoll tune: --{name} must be at least 1, got {getattr(args, name)}")
    if args.passes > args.reps:
        raise SystemExit(f"jaxcoll tune: --passes={args.passes} must be at most --reps={args.reps}: each visit of a "
                         f"cell times every candidate at least once")
    if args.devices % args.processes:
        raise SystemExit(f"jaxcoll tune: --devices={args.devices} does not split evenly over "
                         f"--processes={args.processes}")
    collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    from jaxcoll.tune.registry import TUNED
    known = [c.value for c in TUNED]
    bad = [c for c in collectives if c not in known]
    if bad:
        raise SystemExit(f"jaxcoll tune: --collectives {','.join(bad)} is not tuned; known: {', '.join(known)}")
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"jaxcoll tune: --sizes={args.sizes!r} is not a list of sizes such as 64K,1M") from None
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"jaxcoll tune: --sizes={args.sizes!r} must name positive sizes")
    try:
        args.probe_bytes = parse_size(str(args.probe_bytes))
    except ValueError:
        raise SystemExit(f"jaxcoll tune: --probe-bytes={args.probe_bytes!r} is not a size such as 64M") from None
    if args.probe_bytes < 4096:
        raise SystemExit(f"jaxcoll tune: --probe-bytes must be at least 4K, got {args.probe_bytes}")
    from jaxcoll.tune import file
    path = os.path.abspath(args.out) if args.out else file.default_path()
    if args.processes > 1 and not launch.in_job():
        env = {"JAXCOLL_TRANSPORT": args.transport} if args.transport == "tcp" else {}
        argv = ["-m", "jaxcoll", "tune", *_argv(args), "--out", path]
        results = launch.launch(args.processes, argv, local_devices=args.devices // args.processes, env=env,
                                timeout_s=3 * 3600)
        print(results[0].stdout, end="")
        failed = [r for r in results if r.returncode != 0]
        for r in failed:
            print(f"process {r.process} exited with {r.returncode}:\n{r.stderr[-3000:]}", file=sys.stderr)
        return 1 if failed else 0
    return _tune_here(args, collectives, sizes, path)


def _argv(args) -> list[str]:
    out = []
    for name in ("collectives", "sizes", "devices", "processes", "transport", "top", "reps", "passes", "dtype",
                 "probe_bytes"):
        out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return out + (["--calibrate-only"] if args.calibrate_only else [])


def _tune_here(args, collectives, sizes, path) -> int:
    import jax

    from jaxcoll import launch

    process = launch.start(args.devices)
    import numpy as np
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from jaxcoll.tune import calibration, file, run as tuning_run

    console = Console(width=None if Console().is_terminal else 120, quiet=process != 0)
    devices = jax.devices()
    if {d.platform for d in devices} != {"cpu"}:
        raise SystemExit("jaxcoll tune: the tuner measures the CPU runtime; on GPUs the GPU round's tune step "
                         "calibrates the model (docs/tuning.md, GPU)")
    mesh = jax.sharding.Mesh(np.array(devices), ("i",))
    processes = tuple(int(d.process_index) for d in devices)
    hosts = None
    if len(set(processes)) > 1:
        from jaxcoll import distributed
        hosts = distributed.layout().hosts
    layout = file.layout_key(processes, hosts)
    console.print(f"[bold]jaxcoll tune[/]: {len(devices)} CPU devices, layout {layout}, "
                  f"{file.machine()['cores']} cores; file {path}")
    from jaxcoll.cli.console import busy_machine, busy_meanwhile, cpu_clock
    busy, clock = busy_machine(), cpu_clock()
    if busy:
        console.print(f"warning: {busy}")
    total = len(calibration.training(processes, args.probe_bytes)) + len(collectives) * len(sizes) * args.passes
    with Progress(TextColumn("{task.description:<34}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=process != 0) as bar:
        task = bar.add_task("calibrating", total=total)

        def step(what: str) -> None:
            bar.update(task, advance=1, description=what)

        measured: list = []
        model = calibration.calibrate(devices, reps=args.reps, hosts=hosts, probe_bytes=args.probe_bytes,
                                      progress=step, measured=measured)
        _print_model(console, model)
        if args.calibrate_only:
            return 0
        cells, plans = tuning_run.tune_cells(collectives, sizes, model=model, mesh=mesh, processes=processes,
                                             hosts=hosts, top=args.top, reps=args.reps, passes=args.passes,
                                             dtype=args.dtype,
                                             progress=step)
    _print_cells(console, cells)
    # What the file keeps: the model fitted to calibration and every call the cells timed
    model = tuning_run.refined(model, measured, cells, plans, processes, hosts)
    _print_model(console, model, f"the model the file keeps: fitted again to calibration's {len(measured)} calls "
                                 f"and the cells' {sum(len(c.seconds) for c in cells)}")
    busy = busy_meanwhile(clock)
    if busy:
        console.print(f"warning: {busy}")
    if process == 0:
        tuning_run.write(path, layout, processes, hosts, model, cells, plans)
        console.print(f"wrote {path}")
    return 0


def _print_model(console, model, title="measured model (jaxcoll.sim.machine.MachineModel)") -> None:
    from rich.table import Table
    t = Table(title=title)
    t.add_column("constant")
    t.add_column("value", justify="right")
    t.add_row("call", f"{model.call_s * 1e6:.1f} us")
    t.add_row("helper threads joined", f"{model.helpers_s * 1e6:.1f} us")
    t.add_row("step", f"{model.step_s * 1e9:.0f} ns")
    for size, rate in model.caches:
        t.add_row(f"rate within {size >> 20} MiB of cache, per thread", f"{rate / 1e9:.2f} GB/s")
    t.add_row("memory rate, per thread", f"{model.memory_rate / 1e9:.2f} GB/s")
    t.add_row("reductions' sources, beyond their touches, per thread", f"{model.reduce_rate / 1e9:.2f} GB/s")
    t.add_row("streaming stores, per thread", f"{model.stream_rate / 1e9:.2f} GB/s")
    t.add_row(f"fresh output pages (outputs from {model.fresh_bytes >> 10} KiB a rank), per thread",
              f"{model.fresh_rate / 1e9:.2f} GB/s")
    t.add_row("threads per process", str(model.threads))
    t.add_row("crossing rate / latency (shm)",
              f"{model.crossing_rate / 1e9:.2f} GB/s / {model.crossing_latency_s * 1e6:.0f} us")
    t.add_row("network rate / latency", f"{model.network_rate / 1e9:.2f} GB/s / {model.network_latency_s * 1e6:.0f} us")
    console.print(t)


def _print_cells(console, cells) -> None:
    from rich.table import Table

    from jaxcoll.cli.bench import format_size
    t = Table(title="what auto runs now, against what it ran before (medians)")
    for col in ("collective", "size/rank", "choice", "us", "model's pick", "default", "us", "speedup"):
        t.add_column(col, justify="right" if col in ("us", "speedup", "size/rank") else "left")
    for c in cells:
        t.add_row(c.collective, format_size(c.nbytes), c.choice, f"{c.median(c.choice) * 1e6:.1f}", c.predicted,
                  c.default, f"{c.median(c.default) * 1e6:.1f}", f"{c.median(c.default) / c.median(c.choice):.2f}x")
    console.print(t)
