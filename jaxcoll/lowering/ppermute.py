"""ppermute_p: rank `dst` gets rank `src`'s x for each (src, dst) of `perm`; ranks nobody sends to get zeros;
lax.ppermute. The result stays varying; the transpose is the inverse permutation."""

from __future__ import annotations

from jax.extend.core.primitives import ppermute_p as lax_ppermute_p

from jaxcoll import _jax
from jaxcoll.lowering import groups
from jaxcoll.lowering.custom_call import CollectivePrimitive, emit
from jaxcoll.lowering.lowered_value import LoweredValue
from jaxcoll.plan import Collective

API = "jaxcoll.ppermute"

ppermute_p = CollectivePrimitive("jaxcoll_ppermute")


def bind(x, *, axes: tuple, perm: tuple, algorithm):
    return ppermute_p.bind(groups.pvary_missing(x, axes), axes=axes, perm=perm, algorithm=algorithm)


def _abstract_eval(aval, *, axes, perm, algorithm):
    del perm, algorithm
    groups.axis_names(axes, API)
    groups.check_varying(API, axes, aval)
    return aval, groups.named_axis_effects(axes)


def _lowering(ctx, x, *, axes, perm, algorithm):
    aval, = ctx.avals_in
    groups.check_ppermute_order(ctx, axes, API)
    y = emit(LoweredValue(ctx, x, aval), aval.shape, Collective.PPERMUTE, axes=axes, algorithm=algorithm,
             api_name=API, perm=perm)
    return [y.value]


def _transpose(ct, x, *, axes, perm, algorithm):
    inverse = tuple((d, s) for s, d in perm)
    return (ppermute_p.bind(ct, axes=axes, perm=inverse,
                            algorithm=algorithm if isinstance(algorithm, str) else "auto"),)


def _batcher(axis_data, vals_in, dims_in, *, axes, perm, algorithm):
    (x,), (d,) = vals_in, dims_in
    if axis_data.name not in axes:
        return ppermute_p.bind(x, axes=axes, perm=perm, algorithm=algorithm), d
    if axes != (axis_data.name,):
        raise NotImplementedError(f"{API} over axes={axes} that mix a vmap axis with other axes")
    # Over the vmapped axis alone nothing is communicated; jax.lax's batching rule computes it locally.
    return _jax.batching_rule(lax_ppermute_p)(
        axis_data, vals_in, dims_in, axis_name=axes, perm=perm)


ppermute_p.def_effectful_abstract_eval(_abstract_eval)
_jax.register_lowering(ppermute_p, _lowering, cacheable=False)  # one callsite per call: see custom_call.py
_jax.register_linear(ppermute_p, _transpose)
_jax.register_batching(ppermute_p, _batcher)
