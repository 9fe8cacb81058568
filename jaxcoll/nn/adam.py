"""jaxcoll.nn.adamw: ZeRO-1 AdamW for `jax.jit` programs with shardings, partitioned onto
`jaxcoll.fused.reduce_scatter_adam_all_gather` by `jax.experimental.custom_partitioning` (no shard_map in the
training step).

Each device keeps the float32 moments and master weights of 1/D of its own parameters (D the size of the
data-parallel axis): the parameters a device holds (its tensor-parallel slices, whole where replicated) are
flattened, padded to a multiple of D and split over the data axis. The global state vectors therefore hold, in
mesh order, every device's shard: length `mesh.size * n`, sharded `P((other axes..., data))`. That layout
follows the parameters' shardings; `adamw_init` reads them from the parameters it is given, and `adamw` asks for
the same ones (without the data axis: ZeRO-1 parameters are replicated over it).

Under `jax.jit` with shardings `jax.grad` returns gradients already summed over the data axis, so the op takes
the device's shard of them (`grads_summed=True`), updates it and rebuilds the parameters with one jaxcoll
all-gather. The reduce-scatter half of the fusion needs gradients left unsummed, which a custom_partitioning
rule is not shown (it sees how values are split, not that they are partial sums; docs/fused.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcoll import fused
from jaxcoll.fused.adam import AdamState, _flatten, _unflatten, adamw_shard

API = "jaxcoll.nn.adamw"


def _without(spec: P, axis: str) -> P:
    """`spec` with mesh axis `axis` taken out of every dimension."""
    out = []
    for e in spec:
        names = tuple(e) if isinstance(e, (tuple, list)) else (e,)
        kept = tuple(n for n in names if n is not None and n != axis)
        out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return P(*out)


def _param_spec(leaf_sharding, ndim: int, axis: str) -> P:
    spec = tuple(leaf_sharding.spec) if isinstance(leaf_sharding, NamedSharding) else ()
    return _without(P(*(spec + (None,) * (ndim - len(spec)))), axis)


def state_spec(mesh, axis_name: str) -> P:
    """The sharding of the state vectors: every device's shard in mesh order, the data axis varying fastest."""
    return P(tuple(a for a in mesh.axis_names if a != axis_name) + (axis_name,))


def _check_axis(mesh, axis_name):
    if axis_name not in mesh.axis_names:
        raise ValueError(f"{API}: axis_name={axis_name!r} is not an axis of the mesh {tuple(mesh.axis_names)}")


def adamw_init(params, mesh, axis_name: str = "data") -> AdamState:
    """The ZeRO-1 AdamW state of `params` (arrays placed with NamedShardings on `mesh`) for `adamw`: zero
    moments, float32 master weights, sharded over every device (see the module docstring)."""
    _check_axis(mesh, axis_name)
    specs = jax.tree.map(lambda q: _param_spec(q.sharding, q.ndim, axis_name), params)
    st = state_spec(mesh, axis_name)
    init = jax.shard_map(lambda q: fused.adam_init(q, axis_name), mesh=mesh, in_specs=(specs,),
                         out_specs=AdamState(P(), st, st, st))
    return jax.jit(init)(params)


@functools.cache
def _adamw_op(treedef, ndims: tuple, axis_name: str, hyper: tuple):
    """The partitioned step for one parameter tree structure and hyperparameters (a fixed Shardy rule each)."""
    b1, b2, eps, weight_decay = hyper

    def fun(grads, params, state, lr):
        # The step as one device holding everything runs it; on a mesh of several devices it is only traced for
        # shapes (the partition below runs), and the state vectors may then be longer than the parameters.
        flat, n = _flatten(grads, 1), state.mu.shape[0]
        g = flat[:n] if flat.shape[0] >= n else jnp.pad(flat, (0, n - flat.shape[0]))
        new = adamw_shard(g, state, lr=lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
        total = flat.shape[0]
        master = new.master[:total] if n >= total else jnp.pad(new.master, (0, total - n))
        return _unflatten(master, params), new

    def layout(mesh, arg_infos):
        params = jax.tree.map(lambda i: NamedSharding(mesh, _param_spec(i.sharding, len(i.shape), axis_name)),
                              arg_infos[1])
        st, rep = NamedSharding(mesh, state_spec(mesh, axis_name)), NamedSharding(mesh, P())
        state = AdamState(rep, st, st, st)
        return (params, params, state, rep), (params, state)

    def partition(mesh, arg_infos, out_info):
        args, outs = layout(mesh, arg_infos)

        def lower(grads, params, state, lr):
            return fused.reduce_scatter_adam_all_gather(grads, params, state, axis_name, lr=lr, b1=b1, b2=b2,
                                                        eps=eps, weight_decay=weight_decay, grads_summed=True)

        return mesh, lower, outs, args

    # Factors: leaf i's dimensions are p{i}_{j}, shared by its gradient, parameter and new parameter; the state
    # vectors share z; count and lr are scalars.
    leaves = [" ".join(f"p{i}_{j}" for j in range(d)) for i, d in enumerate(ndims)]
    operands = leaves + leaves + ["", "z", "z", "z", ""]
    results = leaves + ["", "z", "z", "z"]
    op = custom_partitioning(fun)
    op.def_partition(partition=partition,
                     infer_sharding_from_operands=lambda mesh, arg_infos, out: layout(mesh, arg_infos)[1],
                     sharding_rule=", ".join(operands) + " -> " + ", ".join(results))
    return op


def adamw(grads, params, state: AdamState, *, lr, axis_name: str = "data", b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, weight_decay: float = 1e-4):
    """One ZeRO-1 AdamW step under `jax.jit` with shardings: returns `(new_params, new_state)`.

    Equals `optax.adamw(lr, b1, b2, eps, weight_decay=weight_decay)` applied to `grads` (the full gradient, as
    `jax.grad` under jit returns it) to float tolerance. `state` comes from `adamw_init(params, mesh, axis_name)`
    with the parameters placed as they are here; `lr` may be a traced scalar (a schedule). The partitioned
    program runs `jaxcoll.fused.reduce_scatter_adam_all_gather` on every device: its shard of the update and one
    jaxcoll all-gather of the new parameters over `axis_name`.
    """
    g_def, p_def = jax.tree.structure(grads), jax.tree.structure(params)
    if g_def != p_def:
        raise ValueError(f"{API}: grads and params must have the same tree structure, got {g_def} and {p_def}")
    if not isinstance(state, AdamState):
        raise TypeError(f"{API}: state must be a jaxcoll.fused.AdamState (from jaxcoll.nn.adamw_init), got "
                        f"{type(state).__name__}")
    for i, (g, q) in enumerate(zip(jax.tree.leaves(grads), jax.tree.leaves(params))):
        if g.shape != q.shape:
            raise ValueError(f"{API}: leaf {i}: grads shape {g.shape} differs from params shape {q.shape}")
        if not jnp.issubdtype(q.dtype, jnp.floating):
            raise TypeError(f"{API}: leaf {i}: params dtype {q.dtype} is not floating point")
    ndims = tuple(q.ndim for q in jax.tree.leaves(params))
    hyper = tuple(float(v) for v in (b1, b2, eps, weight_decay))
    op = _adamw_op(p_def, ndims, axis_name, hyper)
    return op(grads, params, state, jnp.asarray(lr, jnp.float32))
