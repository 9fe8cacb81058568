"""The exact all_gather: jaxcoll.all_gather without compression, and lax's invariant form."""

from __future__ import annotations

from jax import tree_util

from jaxcoll.exact.arguments import check_algorithm, dimension, leaf_array
from jaxcoll.lowering import all_gather as prim
from jaxcoll.lowering import groups
from jaxcoll.plan import Collective


def all_gather(x, axis_name, *, axis=0, tiled=False, algorithm="auto", invariant=False, reduced=False,
               axis_index_groups=None):
    """`jaxcoll.all_gather(x, axis_name, axis=axis, tiled=tiled, algorithm=algorithm)`: the contract is stated
    there. invariant=True types the result invariant over `axis_name` (lax.all_gather(..., to="invarying")): the
    same data on every rank, as the compressed collectives' last hop and psum-like results need; reduced=True types
    it reduced over them, as lax.all_gather(..., to="reduced") does (its transpose is a reduce_scatter of an
    unreduced cotangent). `axis_index_groups`
    (lax's argument, checked by `groups.index_groups`) runs each group of positions along the axes as a group of its
    own."""
    axes = groups.axis_names(axis_name, prim.API)
    axis_index_groups = groups.index_groups(prim.API, axis_index_groups, axes)
    n = groups.group_size(axes, axis_index_groups)

    def bind(leaf):
        leaf = leaf_array(prim.API, leaf)
        if tiled and leaf.ndim == 0:
            raise ValueError(f"{prim.API}: tiled=True needs an operand of rank >= 1, got a scalar")
        dim = dimension(prim.API, "axis", axis, leaf.ndim if tiled else leaf.ndim + 1)
        check_algorithm(prim.API, Collective.ALL_GATHER, n, leaf, algorithm)
        if reduced:
            return prim.all_gather_reduced_p.bind(leaf, axes=axes, all_gather_dimension=dim, tiled=bool(tiled),
                                                  algorithm=algorithm)
        return prim.bind(leaf, axes=axes, all_gather_dimension=dim, tiled=bool(tiled), algorithm=algorithm,
                         invariant=bool(invariant), axis_index_groups=axis_index_groups)

    return tree_util.tree_map(bind, x)
