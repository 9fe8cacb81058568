"""jaxcoll.nn.cross_entropy: softmax cross-entropy over a vocabulary sharded across devices, for `jax.jit` programs
with shardings, partitioned by jaxcoll (`jax.experimental.custom_partitioning`).

A column-parallel language-model head leaves each device the logits of its slice of the vocabulary. XLA's
partitioner would all-reduce the log-sum-exp's max and sum itself; this op is Megatron's vocabulary-parallel
cross-entropy on jaxcoll's collectives: the rows' maxima in one `jaxcoll.all_reduce(op="max")`, then the sums
of exponentials and the target logits (each target lives on one device's slice) in one sum all-reduce. The
backward pass, softmax minus the one-hot target, needs nothing from other devices: it is local to each slice.
Rows (batch, sequence) keep any sharding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcoll.fused import comm
from jaxcoll.nn.dense import _name, _spec

API = "jaxcoll.nn.cross_entropy"


def _layout(mesh, logits_info):
    """(vocabulary axis or None, rows spec, logits spec) for the logits' sharding."""
    spec = [_name(e) for e in _spec(logits_info.sharding, len(logits_info.shape))]
    v_axis = spec[-1]
    rows = [a if a != v_axis else None for a in spec[:-1]]
    return v_axis, P(*rows), P(*rows, v_axis)


def _slice_offset(v_axis, v_local):
    """The first vocabulary index of this device's slice."""
    return 0 if v_axis is None else lax.axis_index(v_axis) * v_local


def _target_logit(logits, targets, offset):
    """logits[..., target] where the target is in this slice, else 0."""
    local = targets - offset
    mine = (local >= 0) & (local < logits.shape[-1])
    picked = jnp.take_along_axis(logits, jnp.clip(local, 0, logits.shape[-1] - 1)[..., None], axis=-1)[..., 0]
    return jnp.where(mine, picked, 0.0)


def _forward_local(logits, targets, v_axis):
    """(loss, log-sum-exp) per row on this device's vocabulary slice, the slices combined over v_axis."""
    logits = logits.astype(jnp.float32)
    shift = jnp.max(logits, axis=-1)
    if v_axis is not None:
        shift = comm.all_reduce(shift, v_axis, op="max")
    sum_exp = jnp.sum(jnp.exp(logits - shift[..., None]), axis=-1)
    target = _target_logit(logits, targets, _slice_offset(v_axis, logits.shape[-1]))
    if v_axis is not None:
        sum_exp, target = comm.all_reduce(comm.after(jnp.stack([sum_exp, target]), shift), v_axis)
    lse = shift + jnp.log(sum_exp)
    return lse - target, lse


@functools.cache
def _forward_op():
    def layout(mesh, arg_infos):
        v_axis, rows, logits = _layout(mesh, arg_infos[0])
        return v_axis, (NamedSharding(mesh, logits), NamedSharding(mesh, rows)), (NamedSharding(mesh, rows),) * 2

    def partition(mesh, arg_infos, out_info):
        v_axis, args, outs = layout(mesh, arg_infos)
        return mesh, lambda logits, targets: _forward_local(logits, targets, v_axis), outs, args

    op = custom_partitioning(lambda logits, targets: _forward_local(logits, targets, None))
    op.def_partition(partition=partition,
                     infer_sharding_from_operands=lambda mesh, arg_infos, out: layout(mesh, arg_infos)[2],
                     sharding_rule="... v, ... -> ..., ...")
    return op


def _grad_local(logits, targets, lse, dloss, v_axis):
    """d loss / d logits on this slice: (softmax - one_hot(target)) * dloss, no communication."""
    offset = _slice_offset(v_axis, logits.shape[-1])
    softmax = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
    one_hot = (targets - offset)[..., None] == jnp.arange(logits.shape[-1])
    return ((softmax - one_hot) * dloss[..., None]).astype(logits.dtype)


@functools.cache
def _grad_op():
    def layout(mesh, arg_infos):
        v_axis, rows, logits = _layout(mesh, arg_infos[0])
        r = NamedSharding(mesh, rows)
        return v_axis, (NamedSharding(mesh, logits), r, r, r), NamedSharding(mesh, logits)

    def partition(mesh, arg_infos, out_info):
        v_axis, args, out = layout(mesh, arg_infos)
        return mesh, lambda *a: _grad_local(*a, v_axis), out, args

    op = custom_partitioning(lambda logits, targets, lse, dloss: _grad_local(logits, targets, lse, dloss, None))
    op.def_partition(partition=partition,
                     infer_sharding_from_operands=lambda mesh, arg_infos, out: layout(mesh, arg_infos)[2],
                     sharding_rule="... v, ..., ..., ... -> ... v")
    return op


@jax.custom_vjp
def _cross_entropy(logits, targets):
    return _forward_op()(logits, targets)[0]


def _cross_entropy_fwd(logits, targets):
    loss, lse = _forward_op()(logits, targets)
    return loss, (logits, targets, lse)


def _cross_entropy_bwd(res, dloss):
    logits, targets, lse = res
    return _grad_op()(logits, targets, lse, dloss), np.zeros(targets.shape, jax.dtypes.float0)


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def cross_entropy(logits, targets):
    """Per-row softmax cross-entropy, `optax.softmax_cross_entropy_with_integer_labels(logits, targets)`, for
    `jax.jit` with shardings.

    logits (..., V) of a floating dtype, sharded along V over at most one mesh axis (a column-parallel head) and
    along the rows in any way; targets (...) integer class indices in [0, V). Returns the float32 losses (...),
    sharded like the rows. Differentiable in `logits`; the forward pass combines the vocabulary slices with two
    jaxcoll all-reduces (max, then sum), the backward pass is local.
    """
    if np.ndim(logits) < 1 or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(f"{API}: logits must be a floating array (..., V), got {logits.dtype} with shape "
                        f"{tuple(np.shape(logits))}")
    if tuple(np.shape(targets)) != tuple(logits.shape[:-1]):
        raise ValueError(f"{API}: targets.shape={tuple(np.shape(targets))} must be logits.shape[:-1]="
                         f"{tuple(logits.shape[:-1])}")
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        raise TypeError(f"{API}: targets must hold integer class indices, got targets.dtype={targets.dtype}")
    return _cross_entropy(logits, targets)
