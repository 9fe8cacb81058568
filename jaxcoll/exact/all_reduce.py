"""The exact all_reduce: jaxcoll.all_reduce without compression."""

from __future__ import annotations

import jax
from jax import tree_util

from jaxcoll import _jax

from jaxcoll.exact.arguments import check_algorithm, leaf_array
from jaxcoll.lowering import all_reduce as prim
from jaxcoll.lowering import groups
from jaxcoll.lowering.dtypes import check_op
from jaxcoll.plan import Collective


def all_reduce(x, axis_name, *, op="sum", algorithm="auto", axis_index_groups=None):
    """`jaxcoll.all_reduce(x, axis_name, op=op, algorithm=algorithm)`: the contract is stated there.
    `axis_index_groups` (lax's argument, checked by `groups.index_groups`) runs each group of positions along the
    axes as a group of its own."""
    axes = groups.axis_names(axis_name, prim.API)
    op = check_op(prim.API, op)
    axis_index_groups = groups.index_groups(prim.API, axis_index_groups, axes)
    n = groups.group_size(axes, axis_index_groups)

    def bind(leaf):
        leaf = leaf_array(prim.API, leaf, op)
        check_algorithm(prim.API, Collective.ALL_REDUCE, n, leaf, algorithm)
        unreduced = _jax.unreduced_axes(jax.typeof(leaf)) & set(axes)
        if unreduced:  # as lax.psum: the sum of a value unreduced over the axes is jax's unreduced psum
            if op != "sum" or axis_index_groups is not None:
                raise ValueError(f"{prim.API}: x is unreduced over {sorted(unreduced)}; only op='sum' without "
                                 f"axis_index_groups reduces it (as lax.psum), got op={op!r}, "
                                 f"axis_index_groups={axis_index_groups!r}")
            return prim.unreduced_psum_p.bind(leaf, axes=axes, algorithm=algorithm)
        return prim.bind(leaf, axes=axes, op=op, algorithm=algorithm, axis_index_groups=axis_index_groups)

    return tree_util.tree_map(bind, x)
