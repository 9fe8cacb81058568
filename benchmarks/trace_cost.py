"""What jaxcoll.trace costs: the time of an all_reduce call with tracing off, with tracing on, and (with --against)
with tracing off in another checkout (the code before the trace hooks), so that "off costs nothing" is measured.

Each run is a process that times a jitted scan of `--steps` all_reduce calls per launch and reports the median
seconds per call over `--launches` launches (the garbage collector run before each). A round runs three processes in
turn: this checkout untraced ("this"), the other checkout untraced ("against", with --against), and this checkout
alternating launches with tracing off and on ("alternating"; a traced launch writes its file after it, which
disturbs the next launch, so its "off" is not the untraced baseline). The table gives, per side, mode and size, the
median over runs of each run's median and the range of the run medians. The machine's other work moves single runs:
compare the medians, and read the ranges as the noise.

    python benchmarks/trace_cost.py [--against /path/to/other/checkout] [--sizes 4K,256K] [--runs 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def child(sizes: list[int], steps: int, launches: int, devices: int, algorithm: str, traced: bool) -> dict:
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    import tempfile

    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxcoll

    traceable = traced and hasattr(jaxcoll, "trace")
    mesh = jax.make_mesh((devices,), ("i",))
    out = {}
    for nbytes in sizes:
        def body(x):
            def one(c, _):
                return c * 0.5 + jaxcoll.all_reduce(c, "i", algorithm=algorithm) * (0.5 / devices), None
            return lax.scan(one, x, None, length=steps)[0]
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
        x = jax.device_put(jnp.ones(devices * (nbytes // 4), jnp.float32), NamedSharding(mesh, P("i")))
        for _ in range(3):
            jax.block_until_ready(f(x))
        times = {"off": [], "on": []}
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(launches):
                for mode in ("off", "on") if traceable else ("off",):
                    gc.collect()  # a traced launch leaves objects behind (its file's events): not the next one's
                    t0 = time.perf_counter()
                    if mode == "on":
                        with jaxcoll.trace(os.path.join(tmp, "t.json")):
                            t0 = time.perf_counter()
                            jax.block_until_ready(f(x))
                            dt = time.perf_counter() - t0
                    else:
                        jax.block_until_ready(f(x))
                        dt = time.perf_counter() - t0
                    times[mode].append(dt / steps)
        out[str(nbytes)] = {m: statistics.median(v) for m, v in times.items() if v}
    return out


def main() -> None:
    from jaxcoll.cli.bench import format_size, parse_size

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", help="another checkout (built in place) to time with tracing off")
    p.add_argument("--sizes", default="4K,256K", help="per-rank input sizes, comma-separated")
    p.add_argument("--runs", type=int, default=5, help="processes per side")
    p.add_argument("--steps", type=int, default=50, help="all_reduce calls per launch (a scan)")
    p.add_argument("--launches", type=int, default=20, help="timed launches per process and mode")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--algorithm", default="ring",
                   help="the all_reduce plan (ring: 42 steps a rank on 8 ranks, the most events a call)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.child:
        print(json.dumps(child(sizes, args.steps, args.launches, args.devices, args.algorithm, args.traced)))
        return
    # (checkout, whether its launches alternate with traced ones): "this" and "against" run every launch untraced,
    # the same way, so that they compare the code; "alternating" compares tracing on and off in one process.
    sides = {"this": (str(HERE), False), "alternating": (str(HERE), True)}
    if args.against:
        sides["against"] = (str(Path(args.against).resolve()), False)
    results: dict = {}
    for run in range(args.runs):
        for side, (root, traced) in sides.items():
            env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCOLL_")}
            env["PYTHONPATH"] = root
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--sizes", args.sizes,
                   "--steps", str(args.steps), "--launches", str(args.launches), "--devices", str(args.devices),
                   "--algorithm", args.algorithm] + (["--traced"] if traced else [])
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=1800)
            if proc.returncode:  # reported, and left out of the table
                print(f"run {run + 1} {side} failed:\n{proc.stderr[-1500:]}", file=sys.stderr, flush=True)
                continue
            for nbytes, modes in json.loads(proc.stdout.splitlines()[-1]).items():
                for mode, seconds in modes.items():
                    results.setdefault((side, mode, int(nbytes)), []).append(seconds)
            print(f"run {run + 1}/{args.runs} {side} done", file=sys.stderr, flush=True)
    print(f"all_reduce ({args.algorithm}), {args.devices} CPU devices, {os.cpu_count()} cores, a scan of "
          f"{args.steps} calls a launch; per call: median over {args.runs} runs of each run's median over "
          f"{args.launches} launches (range of the run medians)")
    print(f"{'size a rank':>12} {'side':>12} {'tracing':>8} {'us a call':>10}  range")
    for nbytes in sizes:
        for (side, mode, n), v in sorted(results.items()):
            if n == nbytes:
                print(f"{format_size(nbytes):>12} {side:>12} {mode:>8} {statistics.median(v) * 1e6:>10.1f}  "
                      f"{min(v) * 1e6:.1f}-{max(v) * 1e6:.1f}")


if __name__ == "__main__":
    main()
