"""The exact broadcast (jaxcoll.broadcast has no compressed form)."""

from __future__ import annotations

from jax import tree_util

from jaxcoll.exact.arguments import check_algorithm, group_rank, leaf_array
from jaxcoll.lowering import broadcast as prim
from jaxcoll.lowering import groups
from jaxcoll.plan import Collective


def broadcast(x, axis_name, *, root=0, algorithm="auto"):
    """`jaxcoll.broadcast(x, axis_name, root=root, algorithm=algorithm)`: the contract is stated there."""
    axes = groups.axis_names(axis_name, prim.API)
    n = groups.group_size(axes)
    root = group_rank(prim.API, "root", root, n)

    def bind(leaf):
        leaf = leaf_array(prim.API, leaf)
        check_algorithm(prim.API, Collective.BROADCAST, n, leaf, algorithm, root=root)
        return prim.bind(leaf, axes=axes, root=root, algorithm=algorithm)

    return tree_util.tree_map(bind, x)
