"""The exact ppermute (jaxcoll.ppermute has no compressed form)."""

from __future__ import annotations

from jax import tree_util

from jaxcoll.exact.arguments import check_algorithm, leaf_array, permutation_pairs
from jaxcoll.lowering import groups
from jaxcoll.lowering import ppermute as prim
from jaxcoll.plan import Collective


def ppermute(x, axis_name, perm, *, algorithm="auto"):
    """`jaxcoll.ppermute(x, axis_name, perm, algorithm=algorithm)`: the contract is stated there."""
    axes = groups.ppermute_axes(groups.axis_names(axis_name, prim.API))
    n = groups.group_size(axes)
    pairs = permutation_pairs(prim.API, perm, n)

    def bind(leaf):
        leaf = leaf_array(prim.API, leaf)
        check_algorithm(prim.API, Collective.PPERMUTE, n, leaf, algorithm, perm=pairs)
        return prim.bind(leaf, axes=axes, perm=pairs, algorithm=algorithm)

    return tree_util.tree_map(bind, x)
