"""reduce_scatter_adam_all_gather: data-parallel gradient sum, AdamW and parameter all-gather as one op
(CoCoNet's optimizer fusion; ZeRO stage 1): the gradients are reduce-scattered instead of all-reduced, each
rank updates only its 1/p shard of the flattened parameters with float32 master weights and moments, and the
updated shards are all-gathered. The optimizer state of a rank is 1/p of the full state. Replicated parameters
come back through the invariant all-gather (one all-gather's bytes, typed invariant like the parameters), so
the op moves what one all-reduce of the gradients moves and no more.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcoll.fused import comm
from jaxcoll.fused.collective_matmul import _axes

API = "jaxcoll.fused.reduce_scatter_adam_all_gather"


class AdamState(NamedTuple):
    """A rank's shard of the AdamW state: `count` (int32, the same on every rank) and this rank's slice of the
    flattened, zero-padded float32 first moment `mu`, second moment `nu` and master parameters `master`."""
    count: jax.Array
    mu: jax.Array
    nu: jax.Array
    master: jax.Array


def shard_size(params, nranks: int) -> int:
    """Elements of one rank's shard: the flattened parameters padded to a multiple of `nranks`."""
    total = sum(int(np.prod(np.shape(leaf))) for leaf in jax.tree.leaves(params))
    return -(-total // nranks)


def _flatten(tree, nranks: int):
    leaves = jax.tree.leaves(tree)
    flat = jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in leaves]) if leaves else jnp.zeros(0)
    pad = shard_size(tree, nranks) * nranks - flat.shape[0]
    return jnp.pad(flat, (0, pad)) if pad else flat


def _unflatten(flat, like):
    leaves, treedef = jax.tree.flatten(like)
    out, at = [], 0
    for leaf in leaves:
        n = int(np.prod(np.shape(leaf)))
        out.append(flat[at:at + n].reshape(np.shape(leaf)).astype(leaf.dtype))
        at += n
    return jax.tree.unflatten(treedef, out)


def adam_init_global(params, nranks: int) -> AdamState:
    """The state of every rank laid end to end: shard `mu`, `nu`, `master` along their only dimension over the
    data-parallel axis (PartitionSpec(axis)), replicate `count`. For use outside shard_map."""
    master = _flatten(params, nranks)
    return AdamState(jnp.zeros((), jnp.int32), jnp.zeros_like(master), jnp.zeros_like(master), master)


def adam_init(params, axis_name) -> AdamState:
    """This rank's state, inside `jax.shard_map` over `axis_name`: zero moments, master = its parameter shard."""
    p = lax.axis_size(axis_name)
    n = shard_size(params, p)
    master = lax.dynamic_slice_in_dim(_flatten(params, p), lax.axis_index(axis_name) * n, n)
    master = comm.make_varying(master, _axes(axis_name))
    return AdamState(jnp.zeros((), jnp.int32), jnp.zeros_like(master), jnp.zeros_like(master), master)


def reduce_scatter_adam_all_gather(grads, params, opt_state: AdamState, axis_name, *, lr, b1=0.9, b2=0.999,
                                   eps=1e-8, weight_decay=1e-4, grads_summed: bool = False):
    """One AdamW step on the data-parallel sum of `grads`: returns `(new_params, new_opt_state)`.

    Equals `updates, s = optax.adamw(lr, b1, b2, eps, weight_decay=weight_decay).update(lax.psum(grads,
    axis_name), s, params); optax.apply_updates(params, updates)` to float tolerance, with the moments and
    master parameters kept in float32 and sharded over `axis_name` (`opt_state` from `adam_init`).

    Use inside `jax.shard_map` over `axis_name`. `grads` and `params` are pytrees of the same structure and
    shapes. `grads_summed=True` says the gradients are already the data-parallel sum (as `jax.grad` under
    `jax.jit` with shardings returns them): the rank then takes its shard of them instead of reduce-scattering.
    New parameters have `params`' dtypes and typing: invariant over `axis_name` where `params` were
    (replicated), else varying.
    """
    g_leaves, g_def = jax.tree.flatten(grads)
    p_leaves, p_def = jax.tree.flatten(params)
    if g_def != p_def:
        raise ValueError(f"{API}: grads and params must have the same tree structure, got {g_def} and {p_def}")
    for i, (g, q) in enumerate(zip(g_leaves, p_leaves)):
        if np.shape(g) != np.shape(q):
            raise ValueError(f"{API}: leaf {i}: grads shape {np.shape(g)} differs from params shape "
                             f"{np.shape(q)}")
        if not jnp.issubdtype(q.dtype, jnp.floating):
            raise TypeError(f"{API}: leaf {i}: params dtype {np.dtype(q.dtype).name} is not floating point")
    if not isinstance(opt_state, AdamState):
        raise TypeError(f"{API}: opt_state must be a jaxcoll.fused.AdamState (from adam_init), got "
                        f"{type(opt_state).__name__}")
    p = lax.axis_size(axis_name)
    n = shard_size(params, p)
    if opt_state.mu.shape != (n,):
        raise ValueError(f"{API}: opt_state.mu.shape={opt_state.mu.shape} must be ({n},): the rank's shard of "
                         f"{n * p} padded parameter elements over a group of {p}")
    axes = _axes(axis_name)
    if grads_summed:
        g = lax.dynamic_slice_in_dim(_flatten(grads, p), lax.axis_index(axis_name) * n, n)
    else:
        g = comm.reduce_scatter(comm.make_varying(_flatten(grads, p), axes), axis_name, 0)

    state = adamw_shard(g, opt_state, lr=lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    invariant = all(not (set(axes) & comm.vma(leaf)) for leaf in p_leaves)
    master = state.master
    full = comm.all_gather_invariant(master, axis_name, 0) if invariant else comm.all_gather(master, axis_name, 0)
    return _unflatten(full, params), state


def adamw_shard(g, opt_state: AdamState, *, lr, b1, b2, eps, weight_decay) -> AdamState:
    """One AdamW step (optax.adamw's update, bias-corrected moments, decoupled weight decay) of the float32
    vectors in `opt_state` for the gradient `g` of the same length: the arithmetic every ZeRO shard runs."""
    count = opt_state.count + 1
    t = count.astype(jnp.float32)
    mu = b1 * opt_state.mu + (1 - b1) * g
    nu = b2 * opt_state.nu + (1 - b2) * (g * g)
    mu_hat = mu / (1 - b1 ** t)
    nu_hat = nu / (1 - b2 ** t)
    update = mu_hat / (jnp.sqrt(nu_hat) + eps) + weight_decay * opt_state.master
    return AdamState(count, mu, nu, opt_state.master - lr * update)
