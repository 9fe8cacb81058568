"""jaxcoll.all_reduce: the drop-in for lax.psum / lax.pmax / lax.pmin."""

from __future__ import annotations

from jaxcoll import exact
from jaxcoll.compress import collectives as compressed

API = "jaxcoll.all_reduce"


def all_reduce(x, axis_name, *, op="sum", algorithm="auto", compression=None, compress_axes=None,
               axis_index_groups=None):
    """Reduce `x` over the ranks of `axis_name` and give every rank the result, like `lax.psum` (op="sum"),
    `lax.pmax` ("max") or `lax.pmin` ("min").

    Args:
      x: an array or a pytree of arrays (each leaf is reduced on its own). Dtypes: float16, bfloat16, float32,
        float64, int8, int32, int64, uint8, uint32, and bool for "max"/"min". 16-bit floats accumulate in
        float32 and round once.
      axis_name: a mesh axis name of the enclosing `jax.shard_map`, or a tuple of them (one group per
        combination of the mesh's other axes; ranks ordered row-major over the tuple, as in lax).
      op: "sum", "max" or "min"; or "adasum" (`jaxcoll.compress.adasum`, float leaves, power-of-two groups).
      algorithm: "auto", a built-in algorithm name ("direct", "ring", "two_shot") or a `jaxcoll.plan.Plan`
        for this collective and group size.
      compression: None (exact), "bf16", "fp8", "int8", a `jaxcoll.compress` format with its block size, or
        `jaxcoll.compress.TopK(...)` (sparse): float leaves, op="sum"; what travels is the encoded form.
        Error bounds and traffic: docs/compression.md. Derivatives are the exact sum's (straight-through).
      compress_axes: None (compress over all of `axis_name`), or the axis or axes of `axis_name` that are slow
        (e.g. the hosts of ("host", "local")): the sum is exact over the other axes and compressed only across
        these (exact reduce_scatter over the others, compressed all_reduce of the 1/L chunk, exact all_gather;
        `jaxcoll.compress.two_level`). Needs a "bf16", "fp8" or "int8" compression and algorithm="auto".
      axis_index_groups: None (one group: every rank of `axis_name`), or lax's groups: a list of lists of
        positions along `axis_name` that partition it into groups of one size; each group runs as a group of its
        own (its own communicator and plan), and N is the group's size.
        Exact op="sum", "max" and "min" only.

    Returns:
      The same shapes and dtypes as `x`, invariant over `axis_name` under `shard_map(check_vma=True)` (as
      psum's result is). A value already invariant over `axis_name` is summed over its N equal copies, as
      psum does. Every rank's result is bitwise identical. Only op="sum" is differentiable; its transpose is
      psum's.
    """
    if compression is not None or op == "adasum" or compress_axes is not None:
        compressed.no_index_groups(API, axis_index_groups, op=op if op == "adasum" else None,
                                   compression=compression, compress_axes=compress_axes)
        return compressed.all_reduce(x, axis_name, op=op, algorithm=algorithm, compression=compression,
                                     compress_axes=compress_axes)
    return exact.all_reduce(x, axis_name, op=op, algorithm=algorithm, axis_index_groups=axis_index_groups)
