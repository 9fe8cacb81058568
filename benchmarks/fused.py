"""Fused vs unfused step time for each jaxcoll.fused op, and the simulator's estimate of the overlap at TP=8
on a DGX H100 model.

Part 1 measures, on this machine's devices (CPU devices unless a GPU is present), each op at chunks=1 (the
collective and the product one after the other, on jaxcoll's collectives), at the chunk count chosen by size
(chunks=None), and at the ring (chunks=p); median of --reps timed calls after warm-up, alternating variants.
Part 2 needs no device: it prices the ring's hops and the unfused all-gather with `jaxcoll.sim` on
`jaxcoll.topology.preset("dgx-h100")` and the GEMM with a stated H100 rate, and reports the modeled step times.

    python benchmarks/fused.py [--devices 8] [--reps 20] [--sizes 1024,2048] [--no-sim]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def measure(fns, args, reps):
    """Median seconds per call of each fn, interleaved so that machine noise hits every variant alike."""
    import jax
    for f in fns.values():
        jax.block_until_ready(f(*args))
        jax.block_until_ready(f(*args))
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def cpu_table(p, sizes, reps):
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxcoll import fused
    from jaxcoll.fused import chunks as chunking

    mesh = jax.make_mesh((p,), ("i",), axis_types=(AxisType.Auto,), devices=jax.devices()[:p])
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))
    sm = lambda f, i, o: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=i, out_specs=o))
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        # Square-ish transformer layer: M tokens x K hidden, weight K x N sharded over ranks.
        m, k = n, n // 2
        a = put(rng.normal(size=(m, k)).astype(np.float32), P("i"))
        w_col = put(rng.normal(size=(k, k)).astype(np.float32), P(None, "i"))
        h = put(rng.normal(size=(m, k)).astype(np.float32), P(None, "i"))
        w_row = put(rng.normal(size=(k, k)).astype(np.float32), P("i"))
        res = put(rng.normal(size=(m, k)).astype(np.float32), P())
        scale = put(np.ones(k, np.float32), P())
        params = {"w": put(rng.normal(size=(k, k)).astype(np.float32), P())}
        grads = {"w": put(rng.normal(size=(p * k, k)).astype(np.float32), P("i"))}

        cases = {
            "all_gather_matmul": (lambda c: sm(lambda x, w: fused.all_gather_matmul(x, w, "i", chunks=c),
                                                (P("i"), P(None, "i")), P(None, "i")), (a, w_col),
                                  m // p * k * 4),
            "matmul_reduce_scatter": (lambda c: sm(lambda x, w: fused.matmul_reduce_scatter(x, w, "i", chunks=c),
                                                    (P(None, "i"), P("i")), P("i")), (h, w_row), m * k * 4 // p),
            "matmul_all_reduce": (lambda c: sm(lambda x, w, r: fused.matmul_all_reduce(x, w, "i", residual=r,
                                                                                       chunks=c),
                                                (P(None, "i"), P("i"), P()), P()), (h, w_row, res), m * k * 4 // p),
            "reduce_scatter_norm_all_gather": (
                lambda c: sm(lambda x, r, s: fused.reduce_scatter_norm_all_gather(x, "i", residual=r, scale=s,
                                                                                  chunks=c),
                             (P("i"), P(), P()), P("i")),
                (put(rng.normal(size=(p * m, k)).astype(np.float32), P("i")), res, scale), m * k * 4 // p),
        }
        for name, (make, args, block_bytes) in cases.items():
            if name in ("all_gather_matmul", "matmul_reduce_scatter"):
                auto = chunking.choose(name, None, p, block_bytes, 1, "")
                variants = {1: make(1), p: make(p)}
            elif name == "matmul_all_reduce":
                auto = p if block_bytes >= chunking.OVERLAP_MIN_BLOCK_BYTES else 1
                variants = {1: make(1), p: make(p)}
            else:
                auto = 1
                variants = {1: make(1), 2: make(2)}
            t = measure(variants, args, reps)
            base = t[1]
            best_c = min((c for c in t if c != 1), key=t.get)
            rows.append((name, f"{m}x{k}", base, t[best_c], best_c, auto, t[auto]))

        sspec = fused.AdamState(P(), P("i"), P("i"), P("i"))
        state = jax.tree.map(put, fused.adam_init_global(params, p), sspec)
        hyper = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-4)
        adam = sm(lambda g, q, s: fused.reduce_scatter_adam_all_gather(g, q, s, "i", **hyper),
                  (P("i"), P(), sspec), (P(), sspec))

        def unfused(g, q, s):  # all-reduce, then every rank runs the whole AdamW (no ZeRO)
            import jaxcoll
            g = jax.tree.map(lambda x: jaxcoll.all_reduce(x, "i"), g)
            return jax.tree.map(lambda x, y: x - 1e-3 * y, q, g), s

        plain = sm(unfused, (P("i"), P(), sspec), (P(), sspec))
        t = measure({"fused": adam, "all_reduce+sgd": plain}, (grads, params, state), reps)
        rows.append(("reduce_scatter_adam_all_gather", f"{k}x{k}", t["all_reduce+sgd"], t["fused"], "-", "-",
                     t["fused"]))
    return rows


def sim_table():
    """Modeled step time of all_gather_matmul at TP=8 on a DGX H100: unfused = all-gather then GEMM; fused ring
    = own block's GEMM, then p-1 steps each max(hop, block GEMM)."""
    from jaxcoll import algorithms, sim, topology
    from jaxcoll.plan import Collective

    topo = topology.preset("dgx-h100")
    p = 8
    # H100 SXM dense BF16 peak 989 TFLOP/s (NVIDIA H100 datasheet); assume 70% achieved by a large GEMM.
    gemm_flops = 0.7 * 989e12
    ring = [(r, (r + 1) % p) for r in range(p)]
    rows = []
    for tokens, hidden in ((2048, 4096), (8192, 8192), (16384, 12288)):
        ffn = 4 * hidden
        block_bytes = tokens // p * hidden * 2  # bf16
        # sim's nbytes is nccl-tests' S: the gathered output for all_gather, the one block for ppermute.
        t_ag = sim.simulate(algorithms.select(Collective.ALL_GATHER, p, block_bytes), topo, block_bytes * p)
        t_hop = sim.simulate(algorithms.select(Collective.PPERMUTE, p, block_bytes, perm=ring), topo, block_bytes)
        t_gemm = 2 * tokens * hidden * (ffn // p) / gemm_flops
        unfused = t_ag + t_gemm
        fused = t_gemm / p + (p - 1) * max(t_hop, t_gemm / p)
        rows.append((tokens, hidden, ffn, t_ag, t_hop, t_gemm, unfused, fused))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sizes", default="512,2048")
    ap.add_argument("--no-sim", action="store_true")
    args = ap.parse_args(argv)
    import jax
    try:
        jax.config.update("jax_num_cpu_devices", args.devices)
    except RuntimeError:
        pass
    from jaxcoll import fused
    dev = jax.devices()[0]
    print(f"# devices: {args.devices} x {dev.platform} ({dev.device_kind}); fused ops on {fused.BACKEND} "
          f"collectives; median of {args.reps}")
    print(f"| op | shape | unfused (chunks=1) ms | best fused ms | its chunks | auto chunks | auto ms | "
          f"speedup best |")
    print("|---|---|---|---|---|---|---|---|")
    for name, shape, base, best, c, auto, t_auto in cpu_table(args.devices, [int(s) for s in args.sizes.split(",")],
                                                              args.reps):
        print(f"| {name} | {shape} | {base * 1e3:.2f} | {best * 1e3:.2f} | {c} | {auto} | {t_auto * 1e3:.2f} | "
              f"{base / best:.2f}x |")
    if args.no_sim:
        return
    try:
        rows = sim_table()
    except ImportError as e:
        print(f"\nsimulator estimate unavailable: {e}")
        return
    print("\n# all_gather_matmul (MLP up-projection, bf16) at TP=8, DGX H100 model (jaxcoll.sim, GEMM at 70% of "
          "989 TFLOP/s)")
    print("| tokens | hidden | ffn | all-gather us | ring hop us | GEMM us | unfused us | fused ring us | speedup |")
    print("|---|---|---|---|---|---|---|---|---|")
    for tokens, hidden, ffn, t_ag, t_hop, t_gemm, unfused, fused_t in rows:
        print(f"| {tokens} | {hidden} | {ffn} | {t_ag * 1e6:.1f} | {t_hop * 1e6:.1f} | {t_gemm * 1e6:.1f} | "
              f"{unfused * 1e6:.1f} | {fused_t * 1e6:.1f} | {unfused / fused_t:.2f}x |")


if __name__ == "__main__":
    main()
