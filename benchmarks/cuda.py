"""CUDA executor benchmark on ONE GPU (issue 5's speed targets): every rank of an 8-rank group emulated on the
device, timed against a device-to-device cudaMemcpy measured in the same run. Prints a markdown table for
docs/benchmarks.md.

    PYTHONPATH=. python benchmarks/cuda.py [--device 0] [--iters 20] [--ranks 8]

Rows:
- bulk protocol, all_reduce (two_shot and ring) with 256 MiB per rank, all_gather (direct and ring) gathering
  256 MiB per rank (32 MiB inputs at 8 ranks, the nccl-tests convention). "traffic" is the bytes every data
  step of every rank reads and writes per call (computed from the plan) divided by the time; the copy's
  traffic is twice the bytes copied per second (each byte read and written once). Target: >= 85 %.
- packet (LL) protocol, direct all_reduce of 8 KiB per rank: microseconds per call, back-to-back launches and
  one CUDA graph replaying all calls. Target: < 10 us.
"""

from __future__ import annotations

import argparse
import subprocess

import numpy as np

from jaxcoll import algorithms, runtime
from jaxcoll.plan import Collective, encode

MiB = 1 << 20


def gpu_name(device: int) -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", f"--id={device}"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or "unknown GPU"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown GPU"


def time_plan(plan, per_rank_input_bytes: int, *, iters: int, graph: bool, protocol: str, device: int,
              dtype=np.float32) -> dict:
    esize = np.dtype(dtype).itemsize
    elements = per_rank_input_bytes // esize
    elements -= elements % plan.in_blocks
    out_elements = elements // plan.in_blocks * plan.out_blocks
    return runtime._jaxcoll.cuda_time(encode(plan), np.dtype(dtype).name, elements, out_elements, 0, iters, graph,
                                      protocol, 0, device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=8)
    args = ap.parse_args()
    usable, why = runtime.cuda_status()
    if not usable:
        raise SystemExit(f"benchmarks/cuda.py needs a GPU: {why}")
    n = args.ranks
    copy_bytes = 256 * MiB
    copy_bw = runtime._jaxcoll.cuda_memcpy_bandwidth(copy_bytes, args.iters, args.device)
    copy_traffic = 2 * copy_bw
    print(f"GPU {args.device}: {gpu_name(args.device)}; {n} emulated ranks; cudaMemcpy D2D of 256 MiB: "
          f"{copy_bw / 1e9:.1f} GB/s copied ({copy_traffic / 1e9:.1f} GB/s of traffic)\n")

    print("| collective | algorithm | protocol | size per rank | blocks/lane | time | traffic GB/s | vs copy |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [(Collective.ALL_REDUCE, "two_shot", 256 * MiB), (Collective.ALL_REDUCE, "ring", 256 * MiB),
            (Collective.ALL_GATHER, "direct", 256 * MiB // n), (Collective.ALL_GATHER, "ring", 256 * MiB // n)]
    for collective, name, in_bytes in rows:
        plan = algorithms.builtin(collective, name, n)
        r = time_plan(plan, in_bytes, iters=args.iters, graph=False, protocol="bulk", device=args.device)
        traffic = r["traffic_bytes"] / r["seconds_per_call"]
        size = f"{in_bytes // MiB} MiB in" if collective is Collective.ALL_REDUCE else f"{in_bytes * n // MiB} MiB out"
        print(f"| {collective.value} | {name} | {r['protocol']} | {size} | {r['blocks_per_lane']} | "
              f"{r['seconds_per_call'] * 1e3:.2f} ms | {traffic / 1e9:.1f} | {100 * traffic / copy_traffic:.0f} % |")

    print("\n| collective | algorithm | protocol | size per rank | launch | time per call |")
    print("|---|---|---|---|---|---|")
    plan = algorithms.builtin(Collective.ALL_REDUCE, "direct", n)
    for graph in (False, True):
        try:
            r = time_plan(plan, 8 << 10, iters=max(args.iters, 200), graph=graph, protocol="ll", device=args.device)
            t = f"{r['seconds_per_call'] * 1e6:.1f} us"
        except RuntimeError as e:  # e.g. a driver that cannot capture cooperative launches
            t = f"failed: {e}"
        print(f"| all_reduce | direct | ll | 8 KiB | {'CUDA graph replay' if graph else 'back to back'} | {t} |")


if __name__ == "__main__":
    main()
