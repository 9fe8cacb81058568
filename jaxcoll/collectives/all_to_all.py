"""jaxcoll.all_to_all: the drop-in for lax.all_to_all."""

from __future__ import annotations

from jaxcoll import exact


def all_to_all(x, axis_name, split_axis, concat_axis, *, tiled=False, algorithm="auto", axis_index_groups=None):
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
      axis_index_groups: None (one group: every rank of `axis_name`), or lax's groups: a list of lists of
        positions along `axis_name` that partition it into groups of one size; each group runs as a group of its
        own (its own communicator and plan), and N is the group's size.

    Returns:
      The result with lax.all_to_all's shape, varying over `axis_name`. The transpose swaps split_axis and
      concat_axis.
    """
    return exact.all_to_all(x, axis_name, split_axis, concat_axis, tiled=tiled, algorithm=algorithm,
                            axis_index_groups=axis_index_groups)
