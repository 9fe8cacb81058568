"""jaxcoll.ppermute: the drop-in for lax.ppermute."""

from __future__ import annotations

from jax import tree_util

from jaxcoll.collectives.arguments import check_algorithm, leaf_array
from jaxcoll.lowering import groups
from jaxcoll.lowering import ppermute as prim
from jaxcoll.plan import Collective


def ppermute(x, axis_name, perm, *, algorithm="auto"):
    """Send each rank's `x` along the pairs of `perm`, like `lax.ppermute`.

    Args:
      x: an array or a pytree of arrays; any supported dtype (see `all_reduce`).
      axis_name: a mesh axis name of the enclosing `jax.shard_map`, or a tuple of them. As in lax.ppermute,
        the ranks of a tuple are numbered row-major in the mesh's order of those axes, whatever the tuple's
        order (lax.axis_index and all_gather use the tuple's order).
      perm: (source, destination) pairs of ranks in [0, N); no source and no destination may repeat. Rank
        `destination` gets rank `source`'s x; a rank that is no destination gets zeros.
      algorithm: "auto", "direct" or a `jaxcoll.plan.Plan` for this ppermute over N ranks.

    Returns:
      Array(s) of x's shapes and dtypes, varying over `axis_name`. The transpose is the inverse permutation.
    """
    # Ranks of a tuple of axes are numbered in mesh order, as lax.ppermute numbers them.
    axes = groups.in_mesh_order(groups.axis_names(axis_name, prim.API))
    n = groups.group_size(axes)
    pairs = prim.check_perm(perm, n)

    def bind(leaf):
        leaf = leaf_array(prim.API, leaf)
        check_algorithm(prim.API, Collective.PPERMUTE, n, leaf, algorithm, perm=pairs)
        return prim.bind(leaf, axes=axes, perm=pairs, algorithm=algorithm)

    return tree_util.tree_map(bind, x)
