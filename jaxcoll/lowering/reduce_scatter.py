"""reduce_scatter_p: rank r gets block r of the reduction of every rank's x, blocks taken along a dimension;
lax.psum_scatter (and its max/min analogues). The result stays varying over the axes, as lax's does; the sum's
transpose is all_gather."""

from __future__ import annotations

from functools import partial

import numpy as np
from jax import lax

from jaxcoll import _jax
from jaxcoll.lowering import call_plan, groups
from jaxcoll.lowering.custom_call import CollectivePrimitive, emit
from jaxcoll.lowering.lowered_value import LoweredValue
from jaxcoll.plan import Collective

API = "jaxcoll.reduce_scatter"

reduce_scatter_p = CollectivePrimitive("jaxcoll_reduce_scatter")
# jax's psum_scatter of a value unreduced over the axes: the same custom call, typed as jax types it (unreduced
# -> varying over the axes); its transpose is the reduced all_gather.
unreduced_reduce_scatter_p = CollectivePrimitive("jaxcoll_unreduced_reduce_scatter")


def bind(x, *, axes: tuple, scatter_dimension: int, tiled: bool, op: str, algorithm,
         axis_index_groups: tuple | None = None):
    return reduce_scatter_p.bind(groups.pvary_missing(x, axes), axes=axes, scatter_dimension=scatter_dimension,
                                 tiled=tiled, op=op, algorithm=algorithm, axis_index_groups=axis_index_groups)


def _out_shape(shape, n, dim, tiled):
    shape = list(shape)
    if tiled:
        shape[dim] //= n
    else:
        del shape[dim]
    return tuple(shape)


def _abstract_eval(aval, *, axes, scatter_dimension, tiled, op, algorithm, axis_index_groups):
    del op, algorithm
    groups.axis_names(axes, API)
    groups.check_varying(API, axes, aval)
    n = groups.group_size(axes, axis_index_groups)
    return (aval.update(shape=_out_shape(aval.shape, n, scatter_dimension, tiled)),
            groups.named_axis_effects(axes))


def _lowering(ctx, x, *, axes, scatter_dimension, tiled, op, algorithm, axis_index_groups):
    aval, = ctx.avals_in
    out_aval, = ctx.avals_out
    n = groups.lowered_group_size(ctx, axes, axis_index_groups)
    # Input block r is what rank r keeps: bring the blocks to the leading dimension.
    x = LoweredValue(ctx, x, aval)
    if tiled:
        x = x.split(scatter_dimension, n)
    x = x.moveaxis(scatter_dimension, 0)
    y = emit(x, out_aval.shape, Collective.REDUCE_SCATTER, axes=axes, algorithm=algorithm, op=op, api_name=API,
             axis_index_groups=axis_index_groups)
    return [y.value]


def _jvp(primals, tangents, *, op, **params):
    if op != "sum":
        raise NotImplementedError(f"{API}(op={op!r}) is not differentiable; only op='sum' is")
    return _jax.linear_jvp(reduce_scatter_p, primals, tangents, op=op, **params)


def _transpose(ct, x, *, axes, scatter_dimension, tiled, op, algorithm, axis_index_groups):
    from jaxcoll.lowering.all_gather import all_gather_p
    return (all_gather_p.bind(ct, axes=axes, all_gather_dimension=scatter_dimension, tiled=tiled,
                              algorithm=call_plan.for_transpose(algorithm, False), axis_index_groups=axis_index_groups),)


def _batcher(axis_data, vals_in, dims_in, *, axes, scatter_dimension, tiled, op, algorithm, axis_index_groups):
    (x,), (d,) = vals_in, dims_in
    params = dict(axes=axes, tiled=tiled, op=op, algorithm=algorithm, axis_index_groups=axis_index_groups)
    if axis_data.name not in axes:
        if d is None:
            return reduce_scatter_p.bind(x, scatter_dimension=scatter_dimension, **params), None
        if d <= scatter_dimension:
            scatter_dimension += 1
        elif not tiled:
            d -= 1
        return reduce_scatter_p.bind(x, scatter_dimension=scatter_dimension, **params), d
    if axis_index_groups is not None:
        raise NotImplementedError(f"{API}: axis_index_groups over a vmap axis (nor does lax support it)")
    if axes != (axis_data.name,):
        raise NotImplementedError(f"{API} over axes={axes} that mix a vmap axis with other axes")
    # Over the vmapped axis alone: reduce along the batch dimension, then batch the result along the
    # scattered dimension.
    n = axis_data.size
    if d is None:
        y = x * np.asarray(n, x.dtype) if op == "sum" else x
    else:
        y = {"sum": lax.reduce_sum, "max": lax.reduce_max, "min": lax.reduce_min}[op](x, (d,))
    if tiled:
        shape = list(y.shape)
        shape[scatter_dimension:scatter_dimension + 1] = [n, shape[scatter_dimension] // n]
        y = y.reshape(shape)
    return y, scatter_dimension


def _unreduced_abstract_eval(aval, *, axes, scatter_dimension, tiled, algorithm):
    del algorithm
    groups.axis_names(axes, API)
    return _jax.lax_abstract_eval("unreduced_reduce_scatter", aval, axis_name=axes,
                                  scatter_dimension=scatter_dimension, axis_size=groups.group_size(axes), tiled=tiled)


def _unreduced_transpose(ct, x, *, axes, scatter_dimension, tiled, algorithm):
    from jaxcoll.lowering.all_gather import all_gather_reduced_p
    return (all_gather_reduced_p.bind(ct, axes=axes, all_gather_dimension=scatter_dimension, tiled=tiled,
                                      algorithm=call_plan.for_transpose(algorithm, False)),)


def _unreduced_batcher(axis_data, vals_in, dims_in, **params):
    raise NotImplementedError(f"{API} of an unreduced value under vmap (nor does lax support it)")


reduce_scatter_p.def_effectful_abstract_eval(_abstract_eval)
_jax.register_lowering(reduce_scatter_p, _lowering, cacheable=False)  # one callsite per call: see custom_call.py
_jax.register_jvp(reduce_scatter_p, _jvp)
_jax.register_transpose(reduce_scatter_p, partial(_jax.linear_transpose2, _transpose))
_jax.register_batching(reduce_scatter_p, _batcher)

unreduced_reduce_scatter_p.def_effectful_abstract_eval(_unreduced_abstract_eval)
_jax.register_lowering(unreduced_reduce_scatter_p, partial(_lowering, op="sum", axis_index_groups=None),
                       cacheable=False)
_jax.register_linear(unreduced_reduce_scatter_p, _unreduced_transpose)
_jax.register_batching(unreduced_reduce_scatter_p, _unreduced_batcher)
