"""broadcast_p: every rank gets the root's x. The result stays varying over the axes, as lax.pbroadcast's does,
so it composes with out_specs exactly as that does. The transpose reduces the cotangents to the root: the
root gets their sum, every other rank zeros."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxcoll import _jax
from jaxcoll.lowering import groups
from jaxcoll.lowering.custom_call import CollectivePrimitive, emit
from jaxcoll.lowering.lowered_value import LoweredValue
from jaxcoll.plan import Collective

API = "jaxcoll.broadcast"

broadcast_p = CollectivePrimitive("jaxcoll_broadcast")


def bind(x, *, axes: tuple, root: int, algorithm):
    return broadcast_p.bind(groups.pvary_missing(x, axes), axes=axes, root=root, algorithm=algorithm)


def _abstract_eval(aval, *, axes, root, algorithm):
    del root, algorithm
    groups.axis_names(axes, API)
    groups.check_varying(API, axes, aval)
    return aval, groups.named_axis_effects(axes)


def _lowering(ctx, x, *, axes, root, algorithm):
    aval, = ctx.avals_in
    y = emit(LoweredValue(ctx, x, aval), aval.shape, Collective.BROADCAST, axes=axes, algorithm=algorithm,
             api_name=API, root=root)
    return [y.value]


def _transpose(ct, x, *, axes, root, algorithm):
    from jaxcoll.lowering.all_reduce import all_reduce_p
    total = all_reduce_p.bind(ct, axes=axes, op="sum", algorithm="auto", axis_index_groups=None)
    if _jax.check_vma():
        from jaxcoll.lowering import pvary
        total = pvary.bind(total, axes=axes)
    is_root = lax.axis_index(axes) == root
    return (jnp.where(is_root, total, jnp.zeros_like(total)),)


def _batcher(axis_data, vals_in, dims_in, *, axes, root, algorithm):
    (x,), (d,) = vals_in, dims_in
    if axis_data.name not in axes:
        return broadcast_p.bind(x, axes=axes, root=root, algorithm=algorithm), d
    if axes != (axis_data.name,):
        raise NotImplementedError(f"{API} over axes={axes} that mix a vmap axis with other axes")
    # Over the vmapped axis alone nothing is communicated; jax.lax's batching rule computes it locally.
    return _jax.batching_rule(_jax.pbroadcast_p())(
        axis_data, vals_in, dims_in, axis_name=axes, source=root)


broadcast_p.def_effectful_abstract_eval(_abstract_eval)
_jax.register_lowering(broadcast_p, _lowering, cacheable=False)  # one callsite per call: see custom_call.py
_jax.register_linear(broadcast_p, _transpose)
_jax.register_batching(broadcast_p, _batcher)
