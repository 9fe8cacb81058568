"""jaxcoll.all_gather: the drop-in for lax.all_gather."""

from __future__ import annotations

from jaxcoll import exact
from jaxcoll.compress import collectives as compressed

API = "jaxcoll.all_gather"


def all_gather(x, axis_name, *, axis=0, tiled=False, algorithm="auto", compression=None, axis_index_groups=None):
    """Give every rank the `x` of every rank of `axis_name`, in rank order, like `lax.all_gather`.

    Args:
      x: an array or a pytree of arrays (gathered leaf by leaf); any supported dtype (see `all_reduce`).
      axis_name: a mesh axis name of the enclosing `jax.shard_map`, or a tuple of them.
      axis: where the gathered dimension goes. tiled=False: a new dimension of size N at position `axis` of
        the result; tiled=True: the existing dimension `axis` of `x` grows N times (rank r's x is slice r).
      algorithm: "auto", "direct", "ring" or a `jaxcoll.plan.Plan` for all_gather over N ranks.
      compression: None (exact), "bf16", "fp8", "int8" or a `jaxcoll.compress` format (see `all_reduce`);
        every rank's slice, its own included, is the decoded form.
      axis_index_groups: None (one group: every rank of `axis_name`), or lax's groups: a list of lists of
        positions along `axis_name` that partition it into groups of one size; each group runs as a group of its
        own (its own communicator and plan), and N is the group's size.
        Exact only.

    Returns:
      The gathered array(s), varying over `axis_name` as lax.all_gather's result is. The transpose is
      `reduce_scatter` with op="sum".
    """
    if compression is not None:
        compressed.no_index_groups(API, axis_index_groups, compression=compression)
        return compressed.all_gather(x, axis_name, axis=axis, tiled=tiled, algorithm=algorithm,
                                     compression=compression)
    return exact.all_gather(x, axis_name, axis=axis, tiled=tiled, algorithm=algorithm,
                            axis_index_groups=axis_index_groups)
