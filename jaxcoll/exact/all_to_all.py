"""The exact all_to_all (jaxcoll.all_to_all has no compressed form)."""

from __future__ import annotations

from jax import lax, tree_util

from jaxcoll.exact.arguments import check_algorithm, dimension, leaf_array, split_dimension
from jaxcoll.lowering import all_to_all as prim
from jaxcoll.lowering import groups
from jaxcoll.plan import Collective


def all_to_all(x, axis_name, split_axis, concat_axis, *, tiled=False, algorithm="auto", axis_index_groups=None):
    """`jaxcoll.all_to_all(x, axis_name, split_axis, concat_axis, tiled=tiled, algorithm=algorithm)`: the contract
    is stated there. `axis_index_groups` (lax's argument, checked by `groups.index_groups`) runs each group of
    positions along the axes as a group of its own."""
    axes = groups.axis_names(axis_name, prim.API)
    axis_index_groups = groups.index_groups(prim.API, axis_index_groups, axes)
    n = groups.group_size(axes, axis_index_groups)

    def bind(leaf):
        leaf = leaf_array(prim.API, leaf)
        if leaf.ndim == 0:
            raise ValueError(f"{prim.API}: x must have rank >= 1, got a scalar")
        split = split_dimension(prim.API, "split_axis", split_axis, leaf.shape, n, bool(tiled))
        concat = dimension(prim.API, "concat_axis", concat_axis, leaf.ndim)
        check_algorithm(prim.API, Collective.ALL_TO_ALL, n, leaf, algorithm)
        if tiled:
            return prim.bind(leaf, axes=axes, split_axis=split, concat_axis=concat, algorithm=algorithm,
                             axis_index_groups=axis_index_groups)
        # The untiled form moves unit blocks: give the result's new dimension a place, run the tiled form,
        # and drop the emptied split dimension (as lax.all_to_all does).
        if split < concat:
            concat += 1
            leaf = lax.expand_dims(leaf, (concat,))
        elif split > concat:
            leaf = lax.expand_dims(leaf, (concat,))
            split += 1
        out = prim.bind(leaf, axes=axes, split_axis=split, concat_axis=concat, algorithm=algorithm,
                        axis_index_groups=axis_index_groups)
        return lax.squeeze(out, (split,)) if split != concat else out

    return tree_util.tree_map(bind, x)
