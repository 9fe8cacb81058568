"""The exact reduce_scatter: jaxcoll.reduce_scatter without compression."""

from __future__ import annotations

import jax
from jax import tree_util

from jaxcoll import _jax

from jaxcoll.exact.arguments import check_algorithm, leaf_array, split_dimension
from jaxcoll.lowering import groups
from jaxcoll.lowering import reduce_scatter as prim
from jaxcoll.lowering.dtypes import check_op
from jaxcoll.plan import Collective


def reduce_scatter(x, axis_name, *, scatter_dimension=0, tiled=False, op="sum", algorithm="auto",
                   axis_index_groups=None):
    """`jaxcoll.reduce_scatter(x, axis_name, scatter_dimension=..., tiled=..., op=..., algorithm=...)`: the contract
    is stated there. `axis_index_groups` (lax's argument, checked by `groups.index_groups`) runs each group of
    positions along the axes as a group of its own."""
    axes = groups.axis_names(axis_name, prim.API)
    op = check_op(prim.API, op)
    axis_index_groups = groups.index_groups(prim.API, axis_index_groups, axes)
    n = groups.group_size(axes, axis_index_groups)

    def bind(leaf):
        leaf = leaf_array(prim.API, leaf, op)
        if leaf.ndim == 0:
            raise ValueError(f"{prim.API}: x must have rank >= 1 to be scattered, got a scalar")
        dim = split_dimension(prim.API, "scatter_dimension", scatter_dimension, leaf.shape, n, bool(tiled))
        check_algorithm(prim.API, Collective.REDUCE_SCATTER, n, leaf, algorithm)
        unreduced = _jax.unreduced_axes(jax.typeof(leaf)) & set(axes)
        if unreduced:  # as lax.psum_scatter: a value unreduced over the axes is jax's unreduced reduce_scatter
            if op != "sum" or axis_index_groups is not None:
                raise ValueError(f"{prim.API}: x is unreduced over {sorted(unreduced)}; only op='sum' without "
                                 f"axis_index_groups reduces it (as lax.psum_scatter), got op={op!r}, "
                                 f"axis_index_groups={axis_index_groups!r}")
            return prim.unreduced_reduce_scatter_p.bind(leaf, axes=axes, scatter_dimension=dim, tiled=bool(tiled),
                                                        algorithm=algorithm)
        return prim.bind(leaf, axes=axes, scatter_dimension=dim, tiled=bool(tiled), op=op, algorithm=algorithm,
                         axis_index_groups=axis_index_groups)

    return tree_util.tree_map(bind, x)
