"""A jax.jit training loop with shardings (no shard_map in the model) over a 2x4 (data x model) mesh: the MLP's
products are `jaxcoll.nn.dense` (partitioned onto jaxcoll's fused collective matmuls), the optimizer is
`jaxcoll.nn.adamw`, jaxcoll's ZeRO-1 AdamW (partitioned onto `reduce_scatter_adam_all_gather`, state sharded over
"data"); the step has no shard_map. Compared with the
XLA-only program (jnp.matmul, optax.adamw, XLA's partitioner): parameters after N steps, and step times.

    python examples/train_jit_shardings.py [--steps 5] [--batch 8] [--seq 32] [--hidden 32]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcoll import nn

HYPER = dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-2)
WSPECS = {"w1": P(None, "model"), "w2": P("model", None)}


def model(mesh, params, x, matmul):
    s = lambda *spec: NamedSharding(mesh, P(*spec))
    h = jax.lax.with_sharding_constraint(matmul(x, params["w1"]), s("data", None, "model"))
    y = matmul(jax.nn.gelu(h), params["w2"])
    return jax.lax.with_sharding_constraint(y, s("data", "model", None))   # sequence-parallel output


def loss_fn(mesh, params, x, y, matmul):
    return jnp.mean((model(mesh, params, x, matmul) - y) ** 2)


def jaxcoll_step(mesh, lr):
    @jax.jit
    def step(params, state, x, y):
        loss, g = jax.value_and_grad(lambda q: loss_fn(mesh, q, x, y, nn.dense))(params)
        params, state = nn.adamw(g, params, state, lr=lr, axis_name="data", **HYPER)
        return params, state, loss

    return step, lambda params: nn.adamw_init(params, mesh, "data")


def xla_step(mesh, lr):
    tx = optax.adamw(lr, **HYPER)

    @jax.jit
    def step(params, state, x, y):
        loss, g = jax.value_and_grad(lambda q: loss_fn(mesh, q, x, y, jnp.matmul))(params)
        updates, state = tx.update(g, state, params)
        return optax.apply_updates(params, updates), state, loss

    return step, jax.jit(tx.init)


def train(mesh, kind, steps, batch, seq, hidden, lr=1e-2, seed=0):
    key = jax.random.PRNGKey(seed)
    k1, k2, kx, ky = jax.random.split(key, 4)
    params = {"w1": jax.random.normal(k1, (hidden, 4 * hidden)) / np.sqrt(hidden),
              "w2": jax.random.normal(k2, (4 * hidden, hidden)) / np.sqrt(4 * hidden)}
    params = {n: jax.device_put(w, NamedSharding(mesh, WSPECS[n])) for n, w in params.items()}
    data = NamedSharding(mesh, P("data", "model", None))
    x = jax.device_put(jax.random.normal(kx, (batch, seq, hidden)), data)
    y = jax.device_put(jax.random.normal(ky, (batch, seq, hidden)), data)
    step, init = (jaxcoll_step if kind == "jaxcoll" else xla_step)(mesh, lr)
    state = init(params)
    losses, times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, state, loss = step(params, state, x, y)
        losses.append(float(loss))
        times.append(time.perf_counter() - t0)
    return params, np.array(losses), (np.median(times[1:]) if steps > 1 else float("nan")), \
        step.lower(params, state, x, y)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=32)
    args = ap.parse_args(argv)
    try:  # a standalone run: 8 CPU devices (a test has already set them)
        jax.config.update("jax_num_cpu_devices", 8)
    except RuntimeError:
        pass
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    ours, l_ours, t_ours, _ = train(mesh, "jaxcoll", args.steps, args.batch, args.seq, args.hidden)
    ref, l_ref, t_ref, _ = train(mesh, "xla", args.steps, args.batch, args.seq, args.hidden)
    print(f"jit with shardings, 2x4 (data x model) mesh, batch={args.batch}, seq={args.seq}, hidden={args.hidden}")
    print("step  loss(jaxcoll)  loss(XLA)")
    for i, (a, b) in enumerate(zip(l_ours, l_ref)):
        print(f"{i:4d}  {a:13.6f}  {b:13.6f}")
    diff = max(float(jnp.max(jnp.abs(ours[n] - ref[n]))) for n in ours)
    print(f"max |param difference| after {args.steps} steps: {diff:.2e}")
    print(f"step time (median after the first): jaxcoll {t_ours * 1e3:.2f} ms, XLA {t_ref * 1e3:.2f} ms")
    return ours, ref


if __name__ == "__main__":
    main()
