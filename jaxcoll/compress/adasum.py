"""Adasum (Maleki et al., "Scaling Distributed Training with Adaptive Summation", MLSys 2021): an adaptive sum
of data-parallel gradients that adds orthogonal gradients and averages parallel ones.

Two gradients combine as
    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
(a zero vector contributes nothing: its coefficient is taken as 1), and N = 2^m ranks combine recursively over
halves of the rank order: adasum(g_0..g_{N-1}) = adasum(adasum(g_0..g_{N/2-1}), adasum(g_{N/2}..g_{N-1})).
This runs as recursive doubling: at level d = 1, 2, ..., N/2 each rank swaps its partial result with rank
r xor d (jaxcoll.ppermute) and both compute adasum(lower, upper) of the pair, in the same order, so both hold
the same bits. The dot products are taken over each leaf as a whole, in float32 (as Horovod does per tensor).
A last jaxcoll all_gather of 1/N slices gives the result psum's invariant type under shard_map(check_vma=True).
Traffic per rank: log2(N) |x| + (N-1)/N |x|.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcoll import exact
from jaxcoll.lowering import groups

API = "jaxcoll.adasum"


def combine(a, b):
    """adasum(a, b) of two float32 vectors (the formula of the module docstring)."""
    dot = jnp.vdot(a, b)
    aa, bb = jnp.vdot(a, a), jnp.vdot(b, b)
    ca = 1 - jnp.where(aa > 0, dot / (2 * jnp.where(aa > 0, aa, 1)), 0)
    cb = 1 - jnp.where(bb > 0, dot / (2 * jnp.where(bb > 0, bb, 1)), 0)
    return ca * a + cb * b


def _leaf(x, axes: tuple, n: int):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{API}: x must be floating point, got dtype={np.dtype(x.dtype).name}")
    # ppermute numbers a tuple of axes as lax.ppermute does (groups.ppermute_axes); the halves follow it.
    order = groups.ppermute_axes(axes)
    rank = lax.axis_index(order if len(order) > 1 else order[0])
    v = x.astype(jnp.float32).reshape(-1)
    d = 1
    while d < n:
        partner = exact.ppermute(v, order, [(r, r ^ d) for r in range(n)])
        lower = (rank & d) == 0
        v = combine(jnp.where(lower, v, partner), jnp.where(lower, partner, v))
        d *= 2
    # Every rank holds the same v: gather slice r from rank r to type the result invariant.
    per = -(-v.size // n)
    v = jnp.pad(v, (0, per * n - v.size))
    me = lax.axis_index(axes if len(axes) > 1 else axes[0])
    mine = lax.dynamic_slice_in_dim(v, me * per, per)
    v = exact.all_gather(mine, axes, tiled=True, invariant=True)
    return v[:x.size].reshape(x.shape).astype(x.dtype)


def adasum(x, axis_name):
    """The Adasum of `x` over the ranks of `axis_name` (a power-of-two group), on every rank.

    Args:
      x: a float array or a pytree of them; each leaf is combined on its own.
      axis_name: a mesh axis name of the enclosing `jax.shard_map`, or a tuple of them (ranks ordered as
        lax.ppermute orders them; the recursion pairs halves of that order).

    Returns:
      x's shapes and dtypes, invariant over `axis_name` as psum's result is; equal (in float32 arithmetic) to
      the recursive pairwise formula of the module docstring. For two orthogonal gradients it is their sum,
      for N equal gradients g it is g. Differentiable through the formula (jax's rules for its parts).
    """
    axes = groups.axis_names(axis_name, API)
    n = groups.group_size(axes)
    if n & (n - 1):
        raise ValueError(f"{API}: axis_name={axis_name!r} has {n} ranks; Adasum's recursion over halves needs "
                         f"a power of two")
    return jax.tree_util.tree_map(lambda leaf: _leaf(jnp.asarray(leaf), axes, n), x)
