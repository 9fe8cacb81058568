"""jaxcoll.broadcast: every rank gets the root's value (lax.pbroadcast's contract, on every platform)."""

from __future__ import annotations

from jax import tree_util

from jaxcoll.collectives.arguments import check_algorithm, group_rank, leaf_array
from jaxcoll.lowering import broadcast as prim
from jaxcoll.lowering import groups
from jaxcoll.plan import Collective


def broadcast(x, axis_name, *, root=0, algorithm="auto"):
    """Give every rank of `axis_name` the `x` of rank `root`.

    Args:
      x: an array or a pytree of arrays; any supported dtype (see `all_reduce`).
      axis_name: a mesh axis name of the enclosing `jax.shard_map`, or a tuple of them.
      root: the rank, in [0, N), whose x every rank gets.
      algorithm: "auto", "direct" or a `jaxcoll.plan.Plan` for a broadcast from `root` over N ranks.

    Returns:
      Array(s) of x's shapes and dtypes, varying over `axis_name` (as lax.pbroadcast's result is). The
      transpose sums the cotangents into the root and gives the other ranks zeros.
    """
    axes = groups.axis_names(axis_name, prim.API)
    n = groups.group_size(axes)
    root = group_rank(prim.API, "root", root, n)

    def bind(leaf):
        leaf = leaf_array(prim.API, leaf)
        check_algorithm(prim.API, Collective.BROADCAST, n, leaf, algorithm, root=root)
        return prim.bind(leaf, axes=axes, root=root, algorithm=algorithm)

    return tree_util.tree_map(bind, x)
