"""all_gather_p: every rank gets every rank's x, stacked (or, tiled, concatenated) along a dimension in rank
order; lax.all_gather. The result stays varying over the axes, as lax's does; the transpose is reduce_scatter.

all_gather_invariant_p: the same custom call, typed as `lax.all_gather(..., to="invarying")` types it (jax's
all_gather_invariant_p): under shard_map(check_vma=True) the result is invariant over the axes, which is what a
replicated value rebuilt from its shards is. Its transpose takes the rank's slice of the invariant cotangent,
so no collective runs backwards. Without check_vma there is no invariant type to rely on, and it transposes to
a reduce_scatter, as all_gather_p does.
"""

from __future__ import annotations

from functools import partial

from jax import lax

from jaxcoll import _jax
from jaxcoll.lowering import call_plan, groups
from jaxcoll.lowering.custom_call import CollectivePrimitive, emit
from jaxcoll.lowering.lowered_value import LoweredValue
from jaxcoll.plan import Collective

API = "jaxcoll.all_gather"

all_gather_p = CollectivePrimitive("jaxcoll_all_gather")
all_gather_invariant_p = CollectivePrimitive("jaxcoll_all_gather_invariant")
# lax.all_gather(..., to="reduced"): the same custom call again, typed as jax types it (varying -> reduced over
# the axes: a value whose cotangent is unreduced); its transpose is the unreduced reduce_scatter.
all_gather_reduced_p = CollectivePrimitive("jaxcoll_all_gather_reduced")


def bind(x, *, axes: tuple, all_gather_dimension: int, tiled: bool, algorithm, invariant: bool = False,
         axis_index_groups: tuple | None = None):
    """all_gather_p, or with `invariant=True` all_gather_invariant_p (same data movement, invariant result)."""
    prim = all_gather_invariant_p if invariant else all_gather_p
    return prim.bind(groups.pvary_missing(x, axes), axes=axes, all_gather_dimension=all_gather_dimension,
                     tiled=tiled, algorithm=algorithm, axis_index_groups=axis_index_groups)


def _out_shape(shape, n, dim, tiled):
    shape = list(shape)
    if tiled:
        shape[dim] *= n
    else:
        shape.insert(dim, n)
    return tuple(shape)


def _abstract_eval(aval, *, axes, all_gather_dimension, tiled, algorithm, axis_index_groups):
    del algorithm
    groups.axis_names(axes, API)
    groups.check_varying(API, axes, aval)
    n = groups.group_size(axes, axis_index_groups)
    return (aval.update(shape=_out_shape(aval.shape, n, all_gather_dimension, tiled)),
            groups.named_axis_effects(axes))


def _invariant_abstract_eval(aval, **params):
    out, effects = _abstract_eval(aval, **params)
    if _jax.check_vma():
        out = _jax.invariant_over(out, params["axes"])
    return out, effects


def _lowering(ctx, x, *, axes, all_gather_dimension, tiled, algorithm, axis_index_groups):
    aval, = ctx.avals_in
    n = groups.lowered_group_size(ctx, axes, axis_index_groups)
    # Block r of the output is rank r's whole input: gather along a new leading dimension, then move it.
    y = emit(LoweredValue(ctx, x, aval), (n, *aval.shape), Collective.ALL_GATHER, axes=axes, algorithm=algorithm,
             api_name=API, axis_index_groups=axis_index_groups)
    y = y.moveaxis(0, all_gather_dimension)
    if tiled:
        y = y.merge(all_gather_dimension)
    return [y.value]


def _transpose(ct, x, *, axes, all_gather_dimension, tiled, algorithm, axis_index_groups):
    from jaxcoll.lowering.reduce_scatter import reduce_scatter_p
    return (reduce_scatter_p.bind(ct, axes=axes, scatter_dimension=all_gather_dimension, tiled=tiled,
                                  op="sum", algorithm=call_plan.for_transpose(algorithm, False),
                                  axis_index_groups=axis_index_groups),)


def _invariant_transpose(ct, x, *, axes, all_gather_dimension, tiled, algorithm, axis_index_groups):
    if not _jax.check_vma() or axis_index_groups is not None:
        return _transpose(ct, x, axes=axes, all_gather_dimension=all_gather_dimension, tiled=tiled,
                          algorithm=algorithm, axis_index_groups=axis_index_groups)
    # The cotangent is one value on every rank: this rank's input contributed only its own slice of it.
    n = ct.shape[all_gather_dimension] // groups.group_size(axes)
    rank = lax.axis_index(axes if len(axes) > 1 else axes[0])
    out = lax.dynamic_slice_in_dim(ct, rank * n, n, axis=all_gather_dimension)
    return (out if tiled else lax.squeeze(out, [all_gather_dimension]),)


def _reduced_abstract_eval(aval, *, axes, all_gather_dimension, tiled, algorithm):
    del algorithm
    groups.axis_names(axes, API)
    return _jax.lax_abstract_eval("all_gather_reduced", aval, all_gather_dimension=all_gather_dimension,
                                  axis_name=axes, axis_size=groups.group_size(axes), tiled=tiled)


def _reduced_transpose(ct, x, *, axes, all_gather_dimension, tiled, algorithm):
    from jaxcoll.lowering.reduce_scatter import unreduced_reduce_scatter_p
    return (unreduced_reduce_scatter_p.bind(ct, axes=axes, scatter_dimension=all_gather_dimension, tiled=tiled,
                                            algorithm=call_plan.for_transpose(algorithm, False)),)


def _reduced_batcher(axis_data, vals_in, dims_in, **params):
    raise NotImplementedError(f"{API}(to='reduced') under vmap (nor does lax support it)")


def _batcher(prim, axis_data, vals_in, dims_in, *, axes, all_gather_dimension, tiled, algorithm,
             axis_index_groups):
    (x,), (d,) = vals_in, dims_in
    params = dict(axes=axes, tiled=tiled, algorithm=algorithm, axis_index_groups=axis_index_groups)
    if axis_data.name not in axes:
        if d is None:
            return prim.bind(x, all_gather_dimension=all_gather_dimension, **params), None
        if d <= all_gather_dimension:
            all_gather_dimension += 1
        elif not tiled:
            d += 1
        return prim.bind(x, all_gather_dimension=all_gather_dimension, **params), d
    if axis_index_groups is not None:
        raise NotImplementedError(f"{API}: axis_index_groups over a vmap axis (nor does lax support it)")
    if axes != (axis_data.name,):
        raise NotImplementedError(f"{API} over axes={axes} that mix a vmap axis with other axes")
    # Over the vmapped axis alone the gathered values are already here: move the batch dimension into place.
    if d is None:
        shape = list(x.shape)
        shape.insert(all_gather_dimension, axis_data.size)
        y = lax.broadcast_in_dim(x, shape, [i for i in range(len(shape)) if i != all_gather_dimension])
    else:
        perm = [i for i in range(x.ndim) if i != d]
        perm.insert(all_gather_dimension, d)
        y = lax.transpose(x, perm)
    if tiled:
        shape = list(y.shape)
        shape[all_gather_dimension:all_gather_dimension + 2] = [shape[all_gather_dimension] *
                                                                shape[all_gather_dimension + 1]]
        y = y.reshape(shape)
    return y, None


all_gather_p.def_effectful_abstract_eval(_abstract_eval)
_jax.register_lowering(all_gather_p, _lowering, cacheable=False)  # one callsite per call: see custom_call.py
_jax.register_linear(all_gather_p, _transpose)
_jax.register_batching(all_gather_p, partial(_batcher, all_gather_p))

all_gather_invariant_p.def_effectful_abstract_eval(_invariant_abstract_eval)
_jax.register_lowering(all_gather_invariant_p, _lowering, cacheable=False)
_jax.register_linear(all_gather_invariant_p, _invariant_transpose)
_jax.register_batching(all_gather_invariant_p, partial(_batcher, all_gather_invariant_p))

all_gather_reduced_p.def_effectful_abstract_eval(_reduced_abstract_eval)
_jax.register_lowering(all_gather_reduced_p, partial(_lowering, axis_index_groups=None), cacheable=False)
_jax.register_linear(all_gather_reduced_p, _reduced_transpose)
_jax.register_batching(all_gather_reduced_p, _reduced_batcher)
