"""all_to_all_p: x is split into N blocks along `split_axis`; block p goes to rank p, and each rank concatenates
the blocks it receives along `concat_axis` in rank order. These are the semantics of the primitive under
lax.all_to_all (the public function adds and removes the unit dimensions of the untiled form). The result
stays varying; the transpose swaps the two axes."""

from __future__ import annotations

from jax.extend.core.primitives import all_to_all_p as lax_all_to_all_p

from jaxcoll import _jax
from jaxcoll.lowering import groups
from jaxcoll.lowering.custom_call import CollectivePrimitive, emit
from jaxcoll.lowering.lowered_value import LoweredValue
from jaxcoll.plan import Collective

API = "jaxcoll.all_to_all"

all_to_all_p = CollectivePrimitive("jaxcoll_all_to_all")


def bind(x, *, axes: tuple, split_axis: int, concat_axis: int, algorithm, axis_index_groups: tuple | None = None):
    return all_to_all_p.bind(groups.pvary_missing(x, axes), axes=axes, split_axis=split_axis,
                             concat_axis=concat_axis, algorithm=algorithm, axis_index_groups=axis_index_groups)


def _abstract_eval(aval, *, axes, split_axis, concat_axis, algorithm, axis_index_groups):
    del algorithm
    groups.axis_names(axes, API)
    groups.check_varying(API, axes, aval)
    n = groups.group_size(axes, axis_index_groups)
    shape = list(aval.shape)
    shape[split_axis] //= n
    shape[concat_axis] *= n
    return aval.update(shape=tuple(shape), weak_type=False), groups.named_axis_effects(axes)


def _lowering(ctx, x, *, axes, split_axis, concat_axis, algorithm, axis_index_groups):
    aval, = ctx.avals_in
    n = groups.lowered_group_size(ctx, axes, axis_index_groups)
    # Input block p goes to rank p; output block p came from rank p. Both lie along the leading dimension.
    x = LoweredValue(ctx, x, aval).split(split_axis, n).moveaxis(split_axis, 0)
    y = emit(x, x.shape, Collective.ALL_TO_ALL, axes=axes, algorithm=algorithm, api_name=API,
             axis_index_groups=axis_index_groups)
    y = y.moveaxis(0, concat_axis).merge(concat_axis)
    return [y.value]


def _transpose(ct, x, *, axes, split_axis, concat_axis, algorithm, axis_index_groups):
    return (all_to_all_p.bind(ct, axes=axes, split_axis=concat_axis, concat_axis=split_axis,
                              algorithm=algorithm if isinstance(algorithm, str) else "auto",
                              axis_index_groups=axis_index_groups),)


def _batcher(axis_data, vals_in, dims_in, *, axes, split_axis, concat_axis, algorithm, axis_index_groups):
    (x,), (d,) = vals_in, dims_in
    if axis_data.name not in axes:
        if d is not None:
            split_axis += d <= split_axis
            concat_axis += d <= concat_axis
        return all_to_all_p.bind(x, axes=axes, split_axis=split_axis, concat_axis=concat_axis,
                                 algorithm=algorithm, axis_index_groups=axis_index_groups), d
    if axis_index_groups is not None:
        raise NotImplementedError(f"{API}: axis_index_groups over a vmap axis (nor does lax support it)")
    if axes != (axis_data.name,):
        raise NotImplementedError(f"{API} over axes={axes} that mix a vmap axis with other axes")
    # Over the vmapped axis alone nothing is communicated; jax.lax's batching rule computes it locally.
    return _jax.batching_rule(lax_all_to_all_p)(
        axis_data, vals_in, dims_in, axis_name=axes, split_axis=split_axis, concat_axis=concat_axis,
        axis_index_groups=None, tiled=True)


all_to_all_p.def_effectful_abstract_eval(_abstract_eval)
_jax.register_lowering(all_to_all_p, _lowering, cacheable=False)  # one callsite per call: see custom_call.py
_jax.register_linear(all_to_all_p, _transpose)
_jax.register_batching(all_to_all_p, _batcher)
