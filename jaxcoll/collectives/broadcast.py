"""jaxcoll.broadcast: every rank gets the root's value (lax.pbroadcast's contract, on every platform)."""

from __future__ import annotations

from jaxcoll import exact


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
    return exact.broadcast(x, axis_name, root=root, algorithm=algorithm)
