"""jaxcoll.all_to_all: the drop-in for lax.all_to_all."""

from __future__ import annotations

from jax import lax, tree_util

from jaxcoll.collectives.arguments import check_algorithm, dimension, leaf_array, split_dimension
from jaxcoll.lowering import all_to_all as prim
from jaxcoll.lowering import groups
from jaxcoll.plan import Collective


def all_to_all(x, axis_name, split_axis, concat_axis, *, tiled=False, algorithm="auto"):
    """Split `x` into N blocks along `split_axis`, send block p to rank p, and concatenate the blocks received
    along `concat_axis` in rank order, like `lax.all_to_all`.

    Args:
      x: an array or a pytree of arrays; any supported dtype (see `all_reduce`).
      axis_name: a mesh axis name of the enclosing `jax.shard_map`, or a tuple of them.
      split_axis: tiled=False: a dimension of size N, removed; tiled=True: a dimension divisible by N, which
        shrinks N times.
      concat_axis: tiled=False: where the new dimension of size N goes in the result; tiled=True: the
        dimension that grows N times.
      algorithm: "auto", "direct" or a `jaxcoll.plan.Plan` for all_to_all over N ranks.

    Returns:
      The result with lax.all_to_all's shape, varying over `axis_name`. The transpose swaps split_axis and
      concat_axis.
    """
    axes = groups.axis_names(axis_name, prim.API)
    n = groups.group_size(axes)

    def bind(leaf):
        leaf = leaf_array(prim.API, leaf)
        if leaf.ndim == 0:
            raise ValueError(f"{prim.API}: x must have rank >= 1, got a scalar")
        split = split_dimension(prim.API, "split_axis", split_axis, leaf.shape, n, bool(tiled))
        concat = dimension(prim.API, "concat_axis", concat_axis, leaf.ndim)
        check_algorithm(prim.API, Collective.ALL_TO_ALL, n, leaf, algorithm)
        if tiled:
            return prim.bind(leaf, axes=axes, split_axis=split, concat_axis=concat, algorithm=algorithm)
        # The untiled form moves unit blocks: give the result's new dimension a place, run the tiled form,
        # and drop the emptied split dimension (as lax.all_to_all does).
        if split < concat:
            concat += 1
            leaf = lax.expand_dims(leaf, (concat,))
        elif split > concat:
            leaf = lax.expand_dims(leaf, (concat,))
            split += 1
        out = prim.bind(leaf, axes=axes, split_axis=split, concat_axis=concat, algorithm=algorithm)
        return lax.squeeze(out, (split,)) if split != concat else out

    return tree_util.tree_map(bind, x)
