"""A tensor-parallel transformer block trained in jax.shard_map on jaxcoll's fused ops, next to the same model
written with jax.lax collectives: same loss curve, step times side by side.

Megatron-style tensor parallelism with sequence parallelism over mesh axis "tp": activations between blocks are
sharded over the sequence; attention heads and MLP columns are split over ranks. Each block's QKV and MLP-up
projections are `all_gather_matmul` (the sequence all-gather overlapped with the product), its output and
MLP-down projections `matmul_reduce_scatter`. Every parameter is sharded, so the whole training step (forward,
backward, SGD) runs on jaxcoll's collectives.

    python examples/transformer_tp.py [--steps 5] [--tp 8] [--seq 64] [--hidden 64] [--heads 8]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcoll import fused

AXIS = "tp"
SPECS = {"wqkv": P(None, AXIS), "wo": P(AXIS, None), "w1": P(None, AXIS), "w2": P(AXIS, None)}


class Ops:
    """The two products of the block: jaxcoll's fused ops, or jax.lax's collectives around a dot."""

    def __init__(self, kind: str, chunks=None):
        self.kind, self.chunks = kind, chunks

    def gather_matmul(self, x, w):
        if self.kind == "jaxcoll":
            return fused.all_gather_matmul(x, w, AXIS, gather_axis=0, chunks=self.chunks)
        return lax.all_gather(x, AXIS, axis=0, tiled=True) @ w

    def matmul_scatter(self, x, w):
        if self.kind == "jaxcoll":
            return fused.matmul_reduce_scatter(x, w, AXIS, scatter_axis=0, chunks=self.chunks)
        return lax.psum_scatter(x @ w, AXIS, scatter_dimension=0, tiled=True)

    def total(self, x):
        if self.kind == "jaxcoll":
            import jaxcoll
            return jaxcoll.all_reduce(x, AXIS)
        return lax.psum(x, AXIS)


def rmsnorm(x, eps=1e-6):
    return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps)


def block(params, x, ops: Ops, heads_local: int):
    """x: this rank's (S/p, H) rows; returns the same rows after attention and MLP (pre-norm, residual)."""
    s_full = x.shape[0] * lax.axis_size(AXIS)
    qkv = ops.gather_matmul(rmsnorm(x), params["wqkv"])                       # (S, 3 H/p): local heads
    q, k, v = jnp.split(qkv, 3, axis=-1)
    split = lambda t: t.reshape(s_full, heads_local, -1).transpose(1, 0, 2)
    q, k, v = split(q), split(k), split(v)
    att = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    att = jnp.where(jnp.tril(jnp.ones((s_full, s_full), bool)), att, -1e9)
    o = (jax.nn.softmax(att, -1) @ v).transpose(1, 0, 2).reshape(s_full, -1)  # (S, H/p)
    x = x + ops.matmul_scatter(o, params["wo"])                               # (S/p, H)
    u = jax.nn.gelu(ops.gather_matmul(rmsnorm(x), params["w1"]))              # (S, F/p)
    return x + ops.matmul_scatter(u, params["w2"])


def init_params(key, hidden, ffn):
    k = jax.random.split(key, 4)
    n = lambda key, shape, fan_in: jax.random.normal(key, shape, jnp.float32) / np.sqrt(fan_in)
    return {"wqkv": n(k[0], (hidden, 3 * hidden), hidden), "wo": n(k[1], (hidden, hidden), hidden),
            "w1": n(k[2], (hidden, ffn), hidden), "w2": n(k[3], (ffn, hidden), ffn)}


def make_train_step(mesh, ops: Ops, heads: int, lr: float):
    p = mesh.shape[AXIS]

    def loss_fn(params, x, y):
        out = block(params, x, ops, heads // p)
        return ops.total(jnp.sum((out - y) ** 2)) / (x.shape[0] * p * x.shape[1])

    def step(params, x, y):
        loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda w, d: w - lr * d, params, g), loss

    # wqkv's columns are (q | k | v), each split over ranks by heads: shard the columns in that grouping.
    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(SPECS, P(AXIS), P(AXIS)), out_specs=(SPECS, P())))


def shard_qkv(wqkv, p):
    """Reorder wqkv's columns so that a plain column sharding gives each rank (its q | its k | its v)."""
    h = wqkv.shape[0]
    q, k, v = (c.reshape(h, p, -1) for c in jnp.split(wqkv, 3, axis=-1))
    return jnp.concatenate([q, k, v], axis=-1).reshape(h, -1)


def train(mesh, kind, steps, seq, hidden, heads, lr=0.05, chunks=None, seed=0):
    """Loss per step and seconds per step (after the first, compiling, step)."""
    p = mesh.shape[AXIS]
    key = jax.random.PRNGKey(seed)
    params = init_params(key, hidden, 4 * hidden)
    params["wqkv"] = shard_qkv(params["wqkv"], p)
    params = {n: jax.device_put(w, NamedSharding(mesh, SPECS[n])) for n, w in params.items()}
    kx, ky = jax.random.split(jax.random.fold_in(key, 1))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P(AXIS)))
    x, y = put(jax.random.normal(kx, (seq, hidden))), put(jax.random.normal(ky, (seq, hidden)))
    step = make_train_step(mesh, Ops(kind, chunks), heads, lr)
    losses, times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, loss = step(params, x, y)
        losses.append(float(loss))
        times.append(time.perf_counter() - t0)
    return np.array(losses), (np.median(times[1:]) if steps > 1 else float("nan")), step.lower(params, x, y)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=None)
    args = ap.parse_args(argv)
    try:  # a standalone run: give the CPU backend enough devices (a test has already set 8)
        jax.config.update("jax_num_cpu_devices", max(8, args.tp))
    except RuntimeError:
        pass
    mesh = jax.make_mesh((args.tp,), (AXIS,), axis_types=(AxisType.Auto,), devices=jax.devices()[:args.tp])
    ours, t_ours, _ = train(mesh, "jaxcoll", args.steps, args.seq, args.hidden, args.heads, chunks=args.chunks)
    ref, t_ref, _ = train(mesh, "lax", args.steps, args.seq, args.hidden, args.heads)
    print(f"tensor-parallel block, tp={args.tp}, seq={args.seq}, hidden={args.hidden}, heads={args.heads}, "
          f"chunks={'chosen by size' if args.chunks is None else args.chunks}")
    print("step  loss(jaxcoll)  loss(jax.lax)")
    for i, (a, b) in enumerate(zip(ours, ref)):
        print(f"{i:4d}  {a:13.6f}  {b:13.6f}")
    print(f"step time (median after the first): jaxcoll {t_ours * 1e3:.2f} ms, jax.lax {t_ref * 1e3:.2f} ms")
    return ours, ref


if __name__ == "__main__":
    main()
