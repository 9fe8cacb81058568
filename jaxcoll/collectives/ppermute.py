"""jaxcoll.ppermute: the drop-in for lax.ppermute."""

from __future__ import annotations

from jaxcoll import exact


def ppermute(x, axis_name, perm, *, algorithm="auto"):
    """Send each rank's `x` along the pairs of `perm`, like `lax.ppermute`.

    Args:
      x: an array or a pytree of arrays; any supported dtype (see `all_reduce`).
      axis_name: a mesh axis name of the enclosing `jax.shard_map`, or a tuple of them. The ranks of a tuple
        are numbered row-major as lax.ppermute of the running JAX numbers them: in the mesh's order of those
        axes up to jax 0.10; in the tuple's order from jax 0.11, where a tuple out of the mesh's order raises
        RuntimeError unless `jax_raise_on_ppermute_sort_diff` is turned off, as lax.ppermute does.
      perm: (source, destination) pairs of ranks in [0, N); no source and no destination may repeat. Rank
        `destination` gets rank `source`'s x; a rank that is no destination gets zeros.
      algorithm: "auto", "direct" or a `jaxcoll.plan.Plan` for this ppermute over N ranks.

    Returns:
      Array(s) of x's shapes and dtypes, varying over `axis_name`. The transpose is the inverse permutation.
    """
    return exact.ppermute(x, axis_name, perm, algorithm=algorithm)
