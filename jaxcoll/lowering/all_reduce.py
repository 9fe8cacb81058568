"""all_reduce_p: every rank gets the reduction (sum, max or min) of every rank's x; lax.psum / pmax / pmin.

Typing as in jax.lax under shard_map(check_vma=True): the result is invariant over the reduced axes. Only the
sum is linear; its transpose is psum's: under check_vma the cotangent of an invariant result is itself
invariant and transposes to jaxcoll's pvary (whose own transpose is this all_reduce again), otherwise it is
summed again.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from jax import lax

from jaxcoll import _jax
from jaxcoll.lowering import groups
from jaxcoll.lowering.custom_call import CollectivePrimitive, emit
from jaxcoll.lowering.lowered_value import LoweredValue
from jaxcoll.plan import Collective

API = "jaxcoll.all_reduce"

all_reduce_p = CollectivePrimitive("jaxcoll_all_reduce")
# jax's psum of a value unreduced over the axes (each rank holds a partial sum): the same custom call, typed as
# jax types it (unreduced -> invariant over the axes); its transpose is jax's reduced cast, which moves no data.
unreduced_psum_p = CollectivePrimitive("jaxcoll_unreduced_psum")


def bind(x, *, axes: tuple, op: str, algorithm, axis_index_groups: tuple | None = None):
    return all_reduce_p.bind(groups.pvary_missing(x, axes), axes=axes, op=op, algorithm=algorithm,
                             axis_index_groups=axis_index_groups)


def _abstract_eval(aval, *, axes, op, algorithm, axis_index_groups):
    del op, algorithm, axis_index_groups
    groups.axis_names(axes, API)
    if _jax.check_vma():
        groups.check_varying(API, axes, aval)
        aval = _jax.invariant_over(aval, axes)
    return aval, groups.named_axis_effects(axes)


def _lowering(ctx, x, *, axes, op, algorithm, axis_index_groups):
    aval, = ctx.avals_in
    y = emit(LoweredValue(ctx, x, aval), aval.shape, Collective.ALL_REDUCE, axes=axes, algorithm=algorithm, op=op,
             api_name=API, axis_index_groups=axis_index_groups)
    return [y.value]


def _jvp(primals, tangents, *, op, **params):
    if op != "sum":
        raise NotImplementedError(f"{API}(op={op!r}) is not differentiable (nor is lax.p{op}); "
                                  f"only op='sum' is")
    return _jax.linear_jvp(all_reduce_p, primals, tangents, op=op, **params)


def _transpose(ct, x, *, axes, op, algorithm, axis_index_groups):
    if _jax.check_vma():
        if axis_index_groups is not None:  # as lax: a psum over index groups has no invariant typing to transpose
            raise NotImplementedError(f"{API} with axis_index_groups is not differentiable under check_vma")
        from jaxcoll.lowering import pvary
        return (pvary.bind(ct, axes=axes, algorithm=algorithm),)
    return (all_reduce_p.bind(ct, axes=axes, op=op, algorithm=algorithm, axis_index_groups=axis_index_groups),)


def _batcher(axis_data, vals_in, dims_in, *, axes, op, algorithm, axis_index_groups):
    (x,), (d,) = vals_in, dims_in
    if axis_data.name not in axes:
        return all_reduce_p.bind(x, axes=axes, op=op, algorithm=algorithm, axis_index_groups=axis_index_groups), d
    if axis_index_groups is not None:
        raise NotImplementedError(f"{API}: axis_index_groups over a vmap axis (nor does lax support it)")
    if axes != (axis_data.name,):
        raise NotImplementedError(f"{API} over axes={axes} that mix a vmap axis with other axes")
    # Over the vmapped axis alone there is nothing to communicate: reduce along the batch dimension.
    if d is None:
        return (x * np.asarray(axis_data.size, x.dtype) if op == "sum" else x), None
    reduce = {"sum": lax.reduce_sum, "max": lax.reduce_max, "min": lax.reduce_min}[op]
    return reduce(x, (d,)), None


def _unreduced_abstract_eval(aval, *, axes, algorithm):
    del algorithm
    groups.axis_names(axes, API)
    return _jax.lax_abstract_eval("unreduced_psum", aval, axes=axes)


def _unreduced_transpose(ct, x, *, axes, algorithm):
    return (_jax.preduced(ct, axes),)


def _unreduced_batcher(axis_data, vals_in, dims_in, *, axes, algorithm):
    raise NotImplementedError(f"{API} of an unreduced value under vmap (nor does lax support it)")


all_reduce_p.def_effectful_abstract_eval(_abstract_eval)
_jax.register_lowering(all_reduce_p, _lowering, cacheable=False)  # one callsite per call: see custom_call.py
_jax.register_jvp(all_reduce_p, _jvp)
_jax.register_transpose(all_reduce_p, partial(_jax.linear_transpose2, _transpose))
_jax.register_batching(all_reduce_p, _batcher)

unreduced_psum_p.def_effectful_abstract_eval(_unreduced_abstract_eval)
_jax.register_lowering(unreduced_psum_p, partial(_lowering, op="sum", axis_index_groups=None), cacheable=False)
_jax.register_linear(unreduced_psum_p, _unreduced_transpose)
_jax.register_batching(unreduced_psum_p, _unreduced_batcher)
