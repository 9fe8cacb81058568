"""The replaced program against the same program written with jaxcoll's collectives by hand, side by side, for
what `jaxcoll.replace_collectives` newly reaches: axis_index_groups, ragged_all_to_all, and jax's
reduced/unreduced collectives (an FSDP gradient step).

For each program, --reps rounds (after warm-up) in which every variant runs once, in a shuffled order
(benchmarks/fused.py's `measure`), each variant a jitted shard_map running the step --iters times in a loop:
  - replaced: the program written with jax.lax, through `jaxcoll.replace_collectives`;
  - by hand: the same computation written with jaxcoll's public collectives: a psum over index groups as
    `jaxcoll.all_reduce` over a mesh axis laid out as the groups; the ragged exchange as fixed-size blocks
    through `jaxcoll.all_to_all`; FSDP as `jaxcoll.all_gather` of the weight (its gradient's reduce_scatter
    comes from the transpose);
  - XLA: the lax program untransformed, where XLA:CPU runs it (it has no ragged-all-to-all);
  - A/A: the replaced program compiled a second time, for the noise band of the ratios.
Times are medians per step; "replaced / by hand" is the median over rounds of the ratio.

    python benchmarks/replace.py [--devices 8] [--reps 30] [--iters 10] [--kib 256]
"""

from __future__ import annotations

import argparse

import numpy as np

from fused import measure


def _loop(step, iters):
    from jax import lax
    return lambda *args: lax.fori_loop(0, iters, lambda _, carry: step(carry, *args[1:]), args[0])


def groups_case(n, kib, iters):
    """psum over strided index groups (ranks 0, 2, 4, ... and 1, 3, 5, ...) of `kib` KiB per rank."""
    import jax
    import jaxcoll
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    strided = [list(range(g, n, 2)) for g in range(2)]
    line = jax.make_mesh((n,), ("i",), devices=jax.devices()[:n])
    # The same groups as a mesh axis: device a * 2 + b is rank a of group b along "a".
    grid = jax.sharding.Mesh(np.array(jax.devices()[:n]).reshape(n // 2, 2), ("a", "b"))
    rows = kib * 256 // 8

    def lax_step(x):
        return lax.psum(x, "i", axis_index_groups=strided) * 0.25

    def hand_step(x):
        return jaxcoll.all_reduce(x, "a") * 0.25

    def lax_program():
        return jax.jit(jax.shard_map(_loop(lax_step, iters), mesh=line, in_specs=P("i"), out_specs=P("i"),
                                     check_vma=False))
    hand = jax.jit(jax.shard_map(_loop(hand_step, iters), mesh=grid, in_specs=P(("a", "b")),
                                 out_specs=P(("a", "b")), check_vma=False))
    x = np.random.default_rng(0).normal(size=(n * rows, 8)).astype(np.float32)
    variants = {"replaced": jax.jit(jaxcoll.replace_collectives(lax_program())),
                "by hand": hand, "XLA": lax_program(),
                "replaced again": jax.jit(jaxcoll.replace_collectives(lax_program()))}
    args = {"replaced": (jax.device_put(x, NamedSharding(line, P("i"))),),
            "by hand": (jax.device_put(x, NamedSharding(grid, P(("a", "b")))),)}
    return variants, args, f"f32[{rows},8] per rank, groups of {n // 2}"


def ragged_case(n, kib, iters):
    """ragged_all_to_all: rank r sends (r + d) % 4 + 1 rows of `kib` / n KiB-ish to rank d."""
    import jax
    import jax.numpy as jnp
    import jaxcoll
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((n,), ("i",), devices=jax.devices()[:n])
    width = max(1, kib * 256 // (8 * n))
    sizes = np.array([[(r + d) % 4 + 1 for d in range(n)] for r in range(n)], np.int32)
    rows = 4 * n
    input_offsets = (np.cumsum(sizes, axis=1) - sizes).astype(np.int32)
    output_offsets = (np.cumsum(sizes, axis=0) - sizes).astype(np.int32)

    def lax_step(x, io, ss, oo, rs):
        return lax.ragged_all_to_all(x[0], jnp.zeros_like(x[0]), io[0], ss[0], oo[0], rs[0], axis_name="i")[None]

    def hand_step(x, io, ss, oo, rs):
        # What a user writes with jaxcoll's public all_to_all: each slice padded to the largest a slice can be.
        operand, within = x[0], jnp.arange(rows)
        blocks = jnp.take(operand, io[0][:, None] + within, axis=0, mode="clip")
        received = jaxcoll.all_to_all(blocks, "i", 0, 0, tiled=True)
        offsets = jaxcoll.all_to_all(oo[0], "i", 0, 0, tiled=True)
        target = jnp.where(within < rs[0][:, None], offsets[:, None] + within, rows)
        return jnp.zeros_like(operand).at[target.reshape(-1)].set(received.reshape(-1, width), mode="drop")[None]

    def program(step):
        return jax.jit(jax.shard_map(_loop(step, iters), mesh=mesh, in_specs=(P("i"),) * 5, out_specs=P("i"),
                                     check_vma=False))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("i")))  # noqa: E731
    x = np.random.default_rng(1).normal(size=(n, rows, width)).astype(np.float32)
    args = tuple(put(a) for a in (x, input_offsets, sizes, output_offsets, sizes.T.copy()))
    variants = {"replaced": jax.jit(jaxcoll.replace_collectives(program(lax_step))),
                "by hand": program(hand_step),
                "replaced again": jax.jit(jaxcoll.replace_collectives(program(lax_step)))}
    return variants, {"replaced": args, "by hand": args}, f"f32[{rows},{width}] per rank, 1-4 rows per peer"


def fsdp_case(n, kib, iters):
    """An FSDP gradient step: the weight sharded over "i", gathered for a tanh layer, its gradient scattered back."""
    import jax
    import jax.numpy as jnp
    import jaxcoll
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((n,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:n])
    hidden = 128
    rows = max(1, kib * 256 // hidden)  # the weight's shard: kib KiB per rank

    def loss(gather, psum):
        return lambda w, batch: psum((jnp.tanh(batch @ gather(w)) ** 2).sum(), "i")

    def step(*collectives):
        grad = jax.grad(loss(*collectives))
        return lambda w, batch: w - 1e-3 * grad(w, batch)

    def program(*collectives):
        return jax.jit(jax.shard_map(_loop(step(*collectives), iters), mesh=mesh, in_specs=(P("i"), P("i")),
                                     out_specs=P("i")))
    reduced = (lambda w: lax.all_gather(w, "i", to="reduced", tiled=True)), lax.psum
    rng = np.random.default_rng(2)
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("i")))  # noqa: E731
    args = (put(rng.normal(size=(n * rows, hidden)).astype(np.float32) / 8),
            put(rng.normal(size=(n * 8, n * rows)).astype(np.float32)))
    variants = {"replaced": jax.jit(jaxcoll.replace_collectives(program(*reduced))),
                "by hand": program(lambda w: jaxcoll.all_gather(w, "i", tiled=True), jaxcoll.all_reduce),
                "XLA": program(*reduced),
                "replaced again": jax.jit(jaxcoll.replace_collectives(program(*reduced)))}
    return variants, {"replaced": args, "by hand": args}, f"weight f32[{n * rows},{hidden}], batch {n * 8} rows"


CASES = {"psum over axis_index_groups": groups_case, "ragged_all_to_all": ragged_case,
         "FSDP gradient step (reduced all_gather)": fsdp_case}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--kib", type=int, default=256)
    args = ap.parse_args(argv)
    import jax
    try:
        jax.config.update("jax_num_cpu_devices", args.devices)
    except RuntimeError:
        pass
    dev = jax.devices()[0]
    print(f"# {args.devices} x {dev.platform} devices ({dev.device_kind}), jax {jax.__version__}; {args.reps} rounds "
          f"of {args.iters} steps per call, variants in shuffled order each round; ms per step (medians)")
    print("| program | shape | replaced | by hand | replaced / by hand | XLA | A/A |")
    print("|---|---|---|---|---|---|---|")
    for name, case in CASES.items():
        variants, inputs, shape = case(args.devices, args.kib, args.iters)
        # Every variant but "by hand" runs the lax program's inputs.
        calls = {k: (lambda f, a: (lambda: f(*a)))(f, inputs.get(k, inputs["replaced"])) for k, f in variants.items()}
        times = measure(calls, (), args.reps)
        per_step = {k: float(np.median(t)) / args.iters * 1e3 for k, t in times.items()}
        ratio = float(np.median(times["replaced"] / times["by hand"]))
        noise = float(np.median(times["replaced again"] / times["replaced"]))
        xla = f"{per_step['XLA']:.3f}" if "XLA" in per_step else "- (XLA:CPU has none)"
        print(f"| {name} | {shape} | {per_step['replaced']:.3f} | {per_step['by hand']:.3f} | {ratio:.2f}x | {xla} | "
              f"{noise:.2f}x |")


if __name__ == "__main__":
    main()
