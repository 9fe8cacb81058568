"""The collectives the fused ops are made of, and the vma bookkeeping around them.

Every fused op is a composition of jaxcoll's public collectives (`jaxcoll.ppermute`, `all_gather`,
`reduce_scatter`, `all_reduce`), so it runs on jaxcoll's runtime and inherits their vjp, vmap and varying /
invariant typing. While those collectives are not importable (the tree is being built), `JAXCOLL_FUSED_BACKEND`
is "lax" and the same compositions run on jax.lax's collectives; tests assert which backend ran.
"""

from __future__ import annotations

import os

import jax
from jax import lax
from jax._src import config as jax_config

import jaxcoll


def _backend() -> str:
    forced = os.environ.get("JAXCOLL_FUSED_BACKEND")
    if forced in ("jaxcoll", "lax"):
        return forced
    return "jaxcoll" if hasattr(jaxcoll, "ppermute") and hasattr(jaxcoll, "reduce_scatter") else "lax"


BACKEND = _backend()


def ppermute(x, axis_name, perm):
    if BACKEND == "jaxcoll":
        return jaxcoll.ppermute(x, axis_name, perm=perm)
    return lax.ppermute(x, axis_name, perm=perm)


def all_gather(x, axis_name, axis):
    """Tiled all-gather along `axis` (varying -> varying, like lax.all_gather)."""
    if BACKEND == "jaxcoll":
        return jaxcoll.all_gather(x, axis_name, axis=axis, tiled=True)
    return lax.all_gather(x, axis_name, axis=axis, tiled=True)


def reduce_scatter(x, axis_name, axis):
    """Tiled sum-scatter along `axis` (lax.psum_scatter's contract)."""
    if BACKEND == "jaxcoll":
        return jaxcoll.reduce_scatter(x, axis_name, scatter_dimension=axis, tiled=True)
    return lax.psum_scatter(x, axis_name, scatter_dimension=axis, tiled=True)


def all_reduce(x, axis_name):
    if BACKEND == "jaxcoll":
        return jaxcoll.all_reduce(x, axis_name)
    return lax.psum(x, axis_name)


def ring(p: int, shift: int = 1):
    """ppermute pairs sending each rank's value `shift` ranks ahead."""
    return [(r, (r + shift) % p) for r in range(p)]


def vma(x) -> frozenset:
    mat = getattr(jax.typeof(x), "mat", None)  # jax 0.10: ShapedArray.mat is the ManualAxisType
    return frozenset(mat.varying) if mat is not None else frozenset()


def make_varying(x, axes: tuple):
    """`x` typed as varying over `axes` (a no-op where it already is, or outside check_vma)."""
    missing = tuple(a for a in axes if a not in vma(x))
    if not missing or not jax_config._check_vma.value:  # no typing to satisfy (custom_partitioning, check_vma=False)
        return x
    return lax.pcast(x, missing, to="varying")


def match_vma(ct, like_vma: frozenset):
    """The cotangent of a primal typed `like_vma`: summed over the axes the primal was invariant over (the
    transpose of using one value on every rank), and made varying where the primal was."""
    extra = tuple(sorted(vma(ct) - like_vma))
    if extra:
        ct = all_reduce(ct, extra if len(extra) > 1 else extra[0])
    return make_varying(ct, tuple(sorted(like_vma)))


def all_gather_invariant(x, axis_name, axis):
    """Tiled all-gather whose result is typed invariant over `axis_name` (lax.all_gather_invariant's
    contract): what a replicated value rebuilt from its shards must be typed as.

    jaxcoll has no invariant all-gather yet, so this is an all-reduce of the rank's block placed in zeros:
    right result and type, twice the bytes of an all-gather.
    """
    if BACKEND == "jaxcoll" and hasattr(jaxcoll, "all_gather_invariant"):
        return jaxcoll.all_gather_invariant(x, axis_name, axis=axis, tiled=True)
    p = lax.axis_size(axis_name)
    n = x.shape[axis]
    shape = x.shape[:axis] + (n * p,) + x.shape[axis + 1:]
    placed = lax.dynamic_update_slice_in_dim(jax.numpy.zeros(shape, x.dtype), x,
                                             lax.axis_index(axis_name) * n, axis=axis)
    return all_reduce(placed, axis_name)


def after(x, prev):
    """`x`, made to depend on `prev` (None: unchanged).

    jaxcoll's runtime blocks a device in each collective's rendezvous, and XLA orders independent custom calls
    differently on different devices, so two collectives with no data dependency can deadlock. Chaining every
    collective of an op after the one before fixes one order on all ranks; the products stay independent of
    the communication, which is what the overlap needs.
    """
    if prev is None:
        return x
    # stop_gradient: the dependency is for ordering only; no cotangent (and no psum of one) flows back to prev.
    return lax.optimization_barrier((lax.stop_gradient(prev), x))[1]
