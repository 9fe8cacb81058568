"""Where the time goes in the GPU round's missed speed targets (issue 14), on ONE GPU, printed as tables.

    PYTHONPATH=. python tools/gpu_profile.py packet   # per-call time of the packet protocol by ranks and plan
    PYTHONPATH=. python tools/gpu_profile.py fused    # the fused ops' parts on the one-GPU mesh
    PYTHONPATH=. python tools/gpu_profile.py launches [packets|synth]  # a few calls, for ncu to catch
    PYTHONPATH=. python tools/gpu_profile.py bulk-plans  # synthesized all_reduce plans against the ring, on bulk

packet: the emulated packet-protocol all_reduce of 8 KiB per rank, by rank count (2, 4, 8) and algorithm, back to
back and as a CUDA graph; a one-rank copy of 8 KiB is the floor of one launch of the executor (a step, no peer).
Run under `ncu --metrics gpu__time_duration.sum -k regex:plan_kernel` to split launch gaps from kernel time.

launches: 6 back-to-back calls each of the 8-rank direct all_reduce on packets (8 KiB per rank), the 2-rank one
and a one-rank all_gather, in that order (after one warm-up call each): the GPU round's ncu step profiles the
third launch in detail and times every launch's kernel alone, which splits a call's time between the kernel and
what surrounds it. `launches synth`: 3 calls of the synthesized ring all_reduce of 64 MiB a rank on bulk, whose
time the H200 measured at 44x the built-in ring's (docs/tuning.md, "GPU").

bulk-plans: the built-in ring and two_shot all_reduce against the synthesized ring, tree and direct plans at 4 and
64 MiB a rank on bulk, each with the executor's blocks per lane and with fewer and more, so a plan that is slow
for want of blocks tells itself from one that is slow at any count.

fused: benchmarks/cuda.py's fused rows (8192^3 bf16 on a one-device mesh) with the one-rank group's collective
lowered as production lowers it (no custom call: the identity) and forced through the executor, next to the
forced collective alone (a 128 MiB all_gather of one rank: a copy) and to `x + x` (the same bytes through XLA).
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

from jaxcoll import algorithms, runtime  # noqa: E402
from jaxcoll.plan import Collective, encode  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20


def per_call_us(plan, nbytes: int, protocol: str, graph: bool, iters: int = 400, blocks: int = 0) -> float:
    ins, outs = plan.elements_for_bytes(nbytes, 4)
    r = runtime._jaxcoll.cuda_time(encode(plan), "float32", ins, outs, 0, iters, graph, protocol, blocks, 0, 60.0)
    return r["seconds_per_call"] * 1e6


def packet() -> None:
    print("| plan | ranks | protocol | back to back (us) | graph replay (us) |")
    print("|---|---|---|---|---|")
    rows = [(Collective.ALL_GATHER, "direct", 1, "ll"), (Collective.ALL_GATHER, "direct", 1, "bulk")]
    rows += [(Collective.ALL_REDUCE, "direct", n, "ll") for n in (2, 4, 8)]
    rows += [(Collective.ALL_REDUCE, "ring", 8, "ll"), (Collective.ALL_REDUCE, "direct", 8, "bulk")]
    for collective, name, n, protocol in rows:
        plan = algorithms.builtin(collective, name, n)
        times = [per_call_us(plan, 8 * KiB, protocol, graph) for graph in (False, True)]
        print(f"| {collective.value} {name} | {n} | {protocol} | {times[0]:.1f} | {times[1]:.1f} |")


def fused() -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxcoll
    from fused import measure
    from jaxcoll import fused as fused_ops
    from jaxcoll.lowering import custom_call

    m = k = n = 8192
    device = jax.devices("cuda")[0]
    mesh = jax.make_mesh((1,), ("i",), devices=[device])
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((m, k), np.float32).astype(jnp.bfloat16), NamedSharding(mesh, P("i")))
    w = jax.device_put(rng.standard_normal((k, n), np.float32).astype(jnp.bfloat16), NamedSharding(mesh, P()))

    def on_mesh(f, in_specs=(P("i"), P())):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=P("i")))

    variants = {}
    for forced in (False, True):
        custom_call.lower_single_rank_groups = forced
        tag = "executor" if forced else "identity"
        for c in (1, 4):
            f = on_mesh(lambda x, w, c=c: fused_ops.all_gather_matmul(x, w, "i", chunks=c))
            g = on_mesh(lambda x, w, c=c: fused_ops.matmul_reduce_scatter(x, w, "i", chunks=c))
            variants[f"all_gather_matmul c={c} ({tag})"] = f
            variants[f"matmul_reduce_scatter c={c} ({tag})"] = g
            jax.block_until_ready(f(x, w))  # lowered now, under this setting
            jax.block_until_ready(g(x, w))
        if forced:
            h = on_mesh(lambda x, w: jaxcoll.all_gather(x, "i", tiled=True))
            variants["all_gather alone, 128 MiB (executor)"] = h
            jax.block_until_ready(h(x, w))
    custom_call.lower_single_rank_groups = False
    variants["x + x, 128 MiB"] = jax.jit(lambda x, w: x + x)
    variants["jnp.dot"] = jax.jit(jnp.dot)
    t = measure(variants, (x, w), 10)
    dot = np.median(t["jnp.dot"])
    print("| program | median ms | of jnp.dot's rate |")
    print("|---|---|---|")
    for name, s in t.items():
        print(f"| {name} | {np.median(s) * 1e3:.3f} | {float(np.median(t['jnp.dot'] / s)):.0%} |")
    print(f"\n(jnp.dot {2 * m * k * n / dot / 1e12:.0f} TFLOP/s)")


def launches(which: str = "packets") -> None:
    if which == "synth":
        from jaxcoll.tune import registry
        plan = registry.candidates("all_reduce", 8)["synth.ring"]
        us = per_call_us(plan, 64 * MiB, "bulk", False, iters=3)
        print(f"all_reduce synth.ring at 8 ranks, 64 MiB, bulk: {us:.1f} us a call")
        return
    rows = [(Collective.ALL_REDUCE, "direct", 8), (Collective.ALL_REDUCE, "direct", 2),
            (Collective.ALL_GATHER, "direct", 1)]
    for collective, name, n in rows:
        plan = algorithms.builtin(collective, name, n)
        print(f"{collective.value} {name} at {n} ranks, 8 KiB, packets: "
              f"{per_call_us(plan, 8 * KiB, 'll', False, iters=6):.1f} us a call")


def bulk_plans() -> None:
    from jaxcoll.tune import registry
    candidates = registry.candidates("all_reduce", 8)
    print("| plan | lanes | per rank | blocks per lane | graph replay (us) |")
    print("|---|---|---|---|---|")
    for name in ("two_shot", "ring", "synth.ring", "synth.tree1", "synth.direct"):
        plan = candidates[name]
        lanes = max(len(p.lanes) for p in plan.ranks)
        for nbytes in (4 * MiB, 64 * MiB):
            ins, outs = plan.elements_for_bytes(nbytes, 4)
            r = runtime._jaxcoll.cuda_time(encode(plan), "float32", ins, outs, 0, 3, True, "bulk", 0, 0, 60.0)
            chosen = r["blocks_per_lane"]
            for blocks in sorted({1, chosen, max(1, chosen // 4)}):
                t = r if blocks == chosen else runtime._jaxcoll.cuda_time(encode(plan), "float32", ins, outs, 0, 3,
                                                                           True, "bulk", blocks, 0, 60.0)
                mark = " (the executor's)" if blocks == chosen else ""
                us = t["seconds_per_call"] * 1e6
                print(f"| {name} | {lanes} | {nbytes // MiB} MiB | {blocks}{mark} | {us:.1f} |")


def hot_sass(ncu: str, report: str, top: int = 40) -> None:
    """The SASS instructions of an ncu report's kernel with the most warp-stall samples, hottest first, with the
    stall reasons ncu attributes to each (its source page, as CSV)."""
    import csv
    import io
    import subprocess
    out = subprocess.run([ncu, "-i", report, "--page", "source", "--csv", "--print-source", "sass"],
                         capture_output=True, text=True, timeout=120)
    rows = list(csv.reader(io.StringIO(out.stdout)))
    header = next((i for i, r in enumerate(rows) if any("Source" in c for c in r)), None)
    samples = None if header is None else next(
        (j for j, c in enumerate(rows[header]) if "Sampling" in c and "All" in c), None)
    if samples is None:
        print("(no stall samples in ncu's source page; its first lines follow)")
        print(out.stdout[:4000] + out.stderr[-2000:])
        return
    names, body = rows[header], rows[header + 1:]

    def count(r):
        try:
            return float(r[samples].replace(",", ""))
        except (ValueError, IndexError):
            return 0.0

    total = sum(count(r) for r in body) or 1.0
    source = next(j for j, c in enumerate(names) if "Source" in c)
    stalls = [j for j, c in enumerate(names) if c.startswith("stall_") or "Stall" in c and j != samples][:12]
    print(f"\n{len(body)} SASS instructions, {total:.0f} warp-stall samples; the {top} hottest:\n")
    print("| samples | share | instruction | " + " | ".join(names[j] for j in stalls) + " |")
    print("|---|---|---|" + "---|" * len(stalls))
    for r in sorted(body, key=count, reverse=True)[:top]:
        cells = " | ".join(r[j] if j < len(r) else "" for j in stalls)
        print(f"| {count(r):.0f} | {count(r) / total:.1%} | `{r[source].strip()}` | {cells} |")


if __name__ == "__main__":
    if sys.argv[1] == "hot-sass":
        hot_sass(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "launches":
        launches(*sys.argv[2:3])
    else:
        {"packet": packet, "fused": fused, "bulk-plans": bulk_plans}[sys.argv[1]]()
