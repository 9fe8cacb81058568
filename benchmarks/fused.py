"""Fused vs unfused step time for each jaxcoll.fused op on this machine's devices, and the simulator's estimate
of the overlap at TP=8 on a DGX H100 model.

Part 1 (devices): for each op and size, --reps rounds (after warm-up) in which each variant runs once, in a
shuffled order, so that machine noise hits them alike; medians of the times and of the per-round ratios, for
  - unfused: the op's unfused composition on jaxcoll's collectives (e.g. `jaxcoll.all_gather` then `@`),
  - fused: the fused op with chunks=None, i.e. the chunk count `jaxcoll.fused.chunks` chooses here,
  - ring: for the ops that can overlap, the forced ring (chunks=p) - what the choice avoids on CPU,
  - XLA: the same unfused composition on jax.lax's collectives, for reference,
  - A/A: the unfused program compiled a second time and timed as if it were a variant: its "speedup" over
    the unfused one (1.00x in a quiet machine) is the noise band the other ratios must be read against.
Part 2 (no device): prices the ring's hops and the unfused collective with `jaxcoll.sim` on
`jaxcoll.topology.preset("dgx-h100")`, and the GEMM at a stated H100 rate.

    python benchmarks/fused.py [--devices 8] [--reps 15] [--sizes 512,1024] [--no-sim] [--no-devices]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def measure(fns, args, reps, seed=0):
    """Per-call seconds of each fn, `reps` rounds after warm-up; in each round every fn runs once, in a shuffled
    order, so that machine noise hits every variant alike and a ratio can be taken within the round."""
    import jax
    for f in fns.values():
        jax.block_until_ready(f(*args))
        jax.block_until_ready(f(*args))
    order = list(fns)
    rng = np.random.default_rng(seed)
    times = {k: [] for k in fns}
    for _ in range(reps):
        rng.shuffle(order)
        for k in order:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[k](*args))
            times[k].append(time.perf_counter() - t0)
    return {k: np.array(v) for k, v in times.items()}


def median_ratio(slow, fast):
    """Median over rounds of slow / fast: the speedup of `fast`, robust to drifts in machine load."""
    return float(np.median(slow / fast))


def _rmsnorm(h, scale, eps=1e-6):
    import jax.numpy as jnp
    from jax import lax
    return h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps) * scale


def device_cases(p, n, rng, put):
    """{op: (variants, args, chosen chunks)} for a layer of n tokens x n/2 hidden over p ranks; each variant is
    a function of the collective set ("jaxcoll" or "lax") or of a chunk count, to be shard_mapped."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax import lax
    from jax.flatten_util import ravel_pytree
    from jax.sharding import PartitionSpec as P

    import jaxcoll
    from jaxcoll import fused
    from jaxcoll.fused import chunks as chunking

    m, k = n, n // 2
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)
    gather = {"jaxcoll": lambda x: jaxcoll.all_gather(x, "i", axis=0, tiled=True),
              "lax": lambda x: lax.all_gather(x, "i", axis=0, tiled=True)}
    scatter = {"jaxcoll": lambda y: jaxcoll.reduce_scatter(y, "i", scatter_dimension=0, tiled=True),
               "lax": lambda y: lax.psum_scatter(y, "i", scatter_dimension=0, tiled=True)}
    total = {"jaxcoll": lambda y: jaxcoll.all_reduce(y, "i"), "lax": lambda y: lax.psum(y, "i")}
    hyper = dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-4)
    tx = optax.adamw(1e-3, **hyper)

    def adam_unfused(coll):
        def step(g, q, s):  # every rank sums the whole gradient and runs AdamW on all of it (no ZeRO)
            # One all-reduce of the flattened gradient: independent jaxcoll collectives (one per leaf) may run
            # in different orders on different devices, and each blocks its device until all ranks arrive.
            flat, unflatten = ravel_pytree(g)
            upd, s = tx.update(unflatten(total[coll](flat)), s, q)
            return optax.apply_updates(q, upd), s
        return step

    params = {"w": f32(k, k), "b": f32(k)}
    sspec = fused.AdamState(P(), P("i"), P("i"), P("i"))
    zero_state = jax.tree.map(put, fused.adam_init_global(params, p), sspec)
    opt_state = tx.init(params)
    ospec = jax.tree.map(lambda _: P(), opt_state)
    gspec = {"w": P("i"), "b": P("i")}
    grads = {"w": put(f32(p * k, k), P("i")), "b": put(f32(p * k), P("i"))}
    params = jax.tree.map(lambda a: put(a, P()), params)
    opt_state = jax.tree.map(lambda a: put(np.asarray(a), P()), opt_state)

    row_block = m * k * 4 // p
    return {
        "all_gather_matmul": dict(
            unfused=lambda c: (lambda x, w: gather[c](x) @ w),
            fused=lambda ch: (lambda x, w: fused.all_gather_matmul(x, w, "i", chunks=ch)),
            specs=((P("i"), P(None, "i")), P(None, "i")), args=(put(f32(m, k), P("i")), put(f32(k, k), P(None, "i"))),
            chosen=chunking.choose("", None, p, m * k * 4 // p, m // p, ""), shape=f"{m}x{k} @ {k}x{k}"),
        "matmul_reduce_scatter": dict(
            unfused=lambda c: (lambda x, w: scatter[c](x @ w)),
            fused=lambda ch: (lambda x, w: fused.matmul_reduce_scatter(x, w, "i", chunks=ch)),
            specs=((P(None, "i"), P("i")), P("i")), args=(put(f32(m, k), P(None, "i")), put(f32(k, k), P("i"))),
            chosen=chunking.choose("", None, p, row_block, m // p, ""), shape=f"{m}x{k} @ {k}x{k}"),
        "matmul_all_reduce": dict(
            unfused=lambda c: (lambda x, w, r: total[c](x @ w) + r),
            fused=lambda ch: (lambda x, w, r: fused.matmul_all_reduce(x, w, "i", residual=r, chunks=ch)),
            specs=((P(None, "i"), P("i"), P()), P()),
            args=(put(f32(m, k), P(None, "i")), put(f32(k, k), P("i")), put(f32(m, k), P())),
            chosen=chunking.choose_pieces("", None, p, row_block, m, ""), shape=f"{m}x{k} @ {k}x{k}"),
        "reduce_scatter_norm_all_gather": dict(
            unfused=lambda c: (lambda x, r, s: _rmsnorm(total[c](x) + r, s)),
            fused=lambda ch: (lambda x, r, s: fused.reduce_scatter_norm_all_gather(x, "i", residual=r, scale=s,
                                                                                   chunks=ch)),
            specs=((P("i"), P(), P()), P()),
            args=(put(f32(p * m, k), P("i")), put(f32(m, k), P()), put(np.ones(k, np.float32), P())),
            chosen=1, shape=f"{m}x{k}", ring=None),
        "reduce_scatter_adam_all_gather": dict(
            unfused=adam_unfused,
            fused=lambda ch: (lambda g, q, s: fused.reduce_scatter_adam_all_gather(g, q, s, "i", lr=1e-3, **hyper)),
            specs=None, args=None, chosen="-", shape=f"{k}x{k}+{k} params", ring=None,
            unfused_io=((gspec, P(), ospec), (P(), ospec), (grads, params, opt_state)),
            fused_io=((gspec, P(), sspec), (P(), sspec), (grads, params, zero_state))),
    }


def device_table(p, sizes, reps):
    """Rows (op, shape, chosen chunks, median seconds, median speedup over unfused) as they are measured."""
    import jax
    from jax.sharding import AxisType, NamedSharding

    mesh = jax.make_mesh((p,), ("i",), axis_types=(AxisType.Auto,), devices=jax.devices()[:p])
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))
    sm = lambda f, i, o: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=i, out_specs=o))
    rng = np.random.default_rng(0)
    for n in sizes:
        for name, case in device_cases(p, n, rng, put).items():
            if case["specs"] is None:  # adam: the unfused and fused programs take different optimizer states
                (ui, uo, uargs), (fi, fo, fargs) = case["unfused_io"], case["fused_io"]
                unfused, xla, fused_f = (sm(case["unfused"]("jaxcoll"), ui, uo), sm(case["unfused"]("lax"), ui, uo),
                                         sm(case["fused"](None), fi, fo))
                again = sm(case["unfused"]("jaxcoll"), ui, uo)
                t = measure({"unfused": lambda *_: unfused(*uargs), "unfused again": lambda *_: again(*uargs),
                             "xla": lambda *_: xla(*uargs), "fused": lambda *_: fused_f(*fargs)}, (), reps)
            else:
                (ins, outs), args = case["specs"], case["args"]
                variants = {"unfused": sm(case["unfused"]("jaxcoll"), ins, outs),
                            "unfused again": sm(case["unfused"]("jaxcoll"), ins, outs),
                            "fused": sm(case["fused"](None), ins, outs),
                            "xla": sm(case["unfused"]("lax"), ins, outs)}
                if case.get("ring", True) is not None:
                    variants["ring"] = sm(case["fused"](p), ins, outs)
                t = measure(variants, args, reps)
            med = {k: float(np.median(v)) for k, v in t.items()}
            ratio = {k: median_ratio(t["unfused"], v) for k, v in t.items()}
            yield name, case["shape"], case["chosen"], med, ratio


# H100 SXM dense BF16 peak 989 TFLOP/s (NVIDIA H100 datasheet); a large GEMM is assumed to reach 70% of it.
H100_GEMM_FLOPS = 0.7 * 989e12


def sim_table():
    """Modeled times at TP=8 on a DGX H100 for a transformer MLP (bf16): the up-projection as
    all_gather_matmul and the down-projection as matmul_reduce_scatter.

    unfused = collective + GEMM, one after the other. Ring = the product of the block at hand while the next
    block travels: GEMM/p + (p-1) max(hop, GEMM/p). In matmul_reduce_scatter the partial sums travel in float32
    (2x the bf16 bytes). Perfect overlap, no slowdown of the GEMM by the copies: an upper bound on the gain.
    """
    from jaxcoll import algorithms, sim, topology
    from jaxcoll.plan import Collective

    topo = topology.preset("dgx-h100")
    p = 8
    ring = [(r, (r + 1) % p) for r in range(p)]
    hop = lambda nbytes: sim.simulate(algorithms.select(Collective.PPERMUTE, p, nbytes, perm=ring), topo, nbytes)
    rows = []
    for tokens, hidden in ((2048, 4096), (8192, 8192), (16384, 12288)):
        ffn = 4 * hidden
        t_gemm = 2 * tokens * hidden * (ffn // p) / H100_GEMM_FLOPS
        # up: gather tokens x hidden (bf16), S = the gathered buffer
        s_ag = tokens * hidden * 2
        t_ag = sim.simulate(algorithms.select(Collective.ALL_GATHER, p, s_ag // p), topo, s_ag)
        t_hop = hop(s_ag // p)
        rows.append(("all_gather_matmul", tokens, hidden, ffn, t_ag, t_hop, t_gemm, t_ag + t_gemm,
                     t_gemm / p + (p - 1) * max(t_hop, t_gemm / p)))
        # down: reduce-scatter the tokens x hidden product (bf16), S = the reduce-scatter's input
        s_rs = tokens * hidden * 2
        t_rs = sim.simulate(algorithms.select(Collective.REDUCE_SCATTER, p, s_rs), topo, s_rs)
        t_hop = hop(2 * s_rs // p)
        rows.append(("matmul_reduce_scatter", tokens, hidden, ffn, t_rs, t_hop, t_gemm, t_gemm + t_rs,
                     t_gemm / p + (p - 1) * max(t_hop, t_gemm / p)))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--sizes", default="512,1024")
    ap.add_argument("--no-sim", action="store_true")
    ap.add_argument("--no-devices", action="store_true")
    args = ap.parse_args(argv)
    if not args.no_devices:
        import jax
        try:
            jax.config.update("jax_num_cpu_devices", args.devices)
        except RuntimeError:
            pass
        dev = jax.devices()[0]
        print(f"# {args.devices} x {dev.platform} devices ({dev.device_kind}); {args.reps} rounds, variants in "
              f"shuffled order each round; times are medians; speedup = median over rounds of unfused / variant")
        print("| op | shape | chosen chunks | unfused ms | fused ms | speedup | ring (chunks=p) ms | ring speedup "
              "| XLA unfused ms | A/A |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, shape, c, med, ratio in device_table(args.devices, [int(s) for s in args.sizes.split(",")],
                                                       args.reps):
            ring = f"{med['ring'] * 1e3:.2f} | {ratio['ring']:.2f}x" if "ring" in med else "- | -"
            print(f"| {name} | {shape} | {c} | {med['unfused'] * 1e3:.2f} | {med['fused'] * 1e3:.2f} | "
                  f"{ratio['fused']:.2f}x | {ring} | {med['xla'] * 1e3:.2f} | {ratio['unfused again']:.2f}x |")
    if args.no_sim:
        return
    print("\n# TP=8, DGX H100 model (jaxcoll.sim on topology.preset('dgx-h100'); GEMM at 70% of 989 TFLOP/s bf16)")
    print("| op | tokens | hidden | ffn | collective us | ring hop us | GEMM us | unfused us | ring us | speedup |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, tokens, hidden, ffn, t_c, t_hop, t_gemm, unfused, ring in sim_table():
        print(f"| {name} | {tokens} | {hidden} | {ffn} | {t_c * 1e6:.1f} | {t_hop * 1e6:.1f} | {t_gemm * 1e6:.1f} | "
              f"{unfused * 1e6:.1f} | {ring * 1e6:.1f} | {unfused / ring:.2f}x |")


if __name__ == "__main__":
    main()
