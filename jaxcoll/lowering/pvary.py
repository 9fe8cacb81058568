"""pvary_p: the invariant -> varying cast of shard_map(check_vma=True), lax.pcast(x, axes, to="varying"), whose
transpose is jaxcoll's all_reduce instead of XLA's psum.

The cast moves no data (it lowers to nothing); it exists for its transpose. Under check_vma the cotangent of a
value made varying is summed over the axes it was made varying over, so every pvary in a forward program is a
psum in its backward pass. jaxcoll's collectives make their invariant inputs varying with this primitive, and
`jaxcoll.replace_collectives` puts it where a program had jax's pvary, so a gradient's psums run on jaxcoll.
"""

from __future__ import annotations

from jax.extend.core import Primitive

from jaxcoll import _jax
from jaxcoll.lowering import groups

API = "jaxcoll.pvary"

pvary_p = Primitive("jaxcoll_pvary")


def bind(x, *, axes: tuple, algorithm="auto"):
    """`x` made varying over `axes` (none of which it may vary over already); `algorithm` is the one its
    transpose's all_reduce runs."""
    return pvary_p.bind(x, axes=tuple(axes), algorithm=algorithm)


def _abstract_eval(aval, *, axes, algorithm):
    del algorithm
    groups.axis_names(axes, API)
    already = sorted(set(axes) & _jax.varying_axes(aval))
    if already:
        raise ValueError(f"{API}: the value already varies over {already} (axes={axes}); pvary makes an "
                         f"invariant value varying")
    return _jax.varying_over(aval, axes)


def _transpose(ct, x, *, axes, algorithm):
    from jaxcoll.lowering.all_reduce import all_reduce_p
    return (all_reduce_p.bind(ct, axes=axes, op="sum", algorithm=algorithm, axis_index_groups=None),)


def _batcher(vals_in, dims_in, *, axes, algorithm):
    (x,), (d,) = vals_in, dims_in
    return pvary_p.bind(x, axes=axes, algorithm=algorithm), d


pvary_p.def_abstract_eval(_abstract_eval)
_jax.register_lowering(pvary_p, lambda ctx, x, **_: [x])
_jax.register_linear(pvary_p, _transpose)
_jax.register_batching(pvary_p, _batcher, axis_data=False)
