"""jaxcoll.reduce_scatter: the drop-in for lax.psum_scatter (with max and min too)."""

from __future__ import annotations

from jaxcoll import exact
from jaxcoll.compress import collectives as compressed

API = "jaxcoll.reduce_scatter"


def reduce_scatter(x, axis_name, *, scatter_dimension=0, tiled=False, op="sum", algorithm="auto",
                   compression=None, compress_axes=None, axis_index_groups=None):
    """Reduce `x` over the ranks of `axis_name` and leave rank r with slice r of the result along
    `scatter_dimension`, like `lax.psum_scatter` (op="sum").

    Args:
      x: an array or a pytree of arrays; dtypes as for `all_reduce`.
      axis_name: a mesh axis name of the enclosing `jax.shard_map`, or a tuple of them.
      scatter_dimension: the dimension of `x` that is split among the ranks. tiled=False: its size must be
        the group size N and it is removed from the result; tiled=True: its size must be divisible by N and
        it shrinks N times.
      op: "sum", "max" or "min".
      algorithm: "auto", "direct", "ring" or a `jaxcoll.plan.Plan` for reduce_scatter over N ranks.
      compression: None (exact), "bf16", "fp8", "int8" or a `jaxcoll.compress` format (see `all_reduce`); the
        block size must divide x.size / N.
      compress_axes: None, or the slow axes of `axis_name`: exact over the others, compressed only across these
        (see `all_reduce`); the pieces are those of lax.psum_scatter over the whole tuple.
      axis_index_groups: None (one group: every rank of `axis_name`), or lax's groups: a list of lists of
        positions along `axis_name` that partition it into groups of one size; each group runs as a group of its
        own (its own communicator and plan), and N is the group's size.
        Exact op="sum", "max" and "min" only.

    Returns:
      The scattered array(s), varying over `axis_name` as lax.psum_scatter's result is. The transpose of
      op="sum" is `all_gather`.
    """
    if compression is not None or compress_axes is not None:
        compressed.no_index_groups(API, axis_index_groups, compression=compression, compress_axes=compress_axes)
        return compressed.reduce_scatter(x, axis_name, scatter_dimension=scatter_dimension, tiled=tiled, op=op,
                                         algorithm=algorithm, compression=compression,
                                         compress_axes=compress_axes)
    return exact.reduce_scatter(x, axis_name, scatter_dimension=scatter_dimension, tiled=tiled, op=op,
                                algorithm=algorithm, axis_index_groups=axis_index_groups)
