"""The collectives the fused ops are made of, and the vma bookkeeping around them.

Every fused op is a composition of jaxcoll's collectives (`jaxcoll.ppermute`, `all_gather`, `reduce_scatter`,
`all_reduce`, and the invariant all-gather of `jaxcoll.lowering.all_gather`), so it runs on jaxcoll's runtime
and inherits their vjp, vmap and varying / invariant typing. There is no fallback to jax.lax's collectives:
tests check that the compiled programs hold jaxcoll custom calls and no XLA collective.
"""

from __future__ import annotations

import functools

import jax
from jax import lax

from jaxcoll import _jax, collectives
from jaxcoll.lowering import all_gather as all_gather_lowering
from jaxcoll.lowering import groups, pvary


def ppermute(x, axis_name, perm):
    return collectives.ppermute(x, axis_name, perm=perm)


def all_gather(x, axis_name, axis):
    """Tiled all-gather along `axis` (varying -> varying, like lax.all_gather)."""
    return collectives.all_gather(x, axis_name, axis=axis, tiled=True)


def reduce_scatter(x, axis_name, axis):
    """Tiled sum-scatter along `axis` (lax.psum_scatter's contract)."""
    return collectives.reduce_scatter(x, axis_name, scatter_dimension=axis, tiled=True)


def all_reduce(x, axis_name, op: str = "sum"):
    return collectives.all_reduce(x, axis_name, op=op)


def all_gather_invariant(x, axis_name, axis):
    """Tiled all-gather along `axis` whose result is typed invariant over `axis_name` (the contract of
    `lax.all_gather(..., to="invarying")`): what a replicated value rebuilt from its shards must be typed as.
    One all-gather's bytes; its transpose slices the cotangent (no collective)."""
    api = "jaxcoll.fused (invariant all-gather)"
    axes = groups.axis_names(axis_name, api)
    return all_gather_lowering.bind(x, axes=axes, all_gather_dimension=axis % x.ndim, tiled=True,
                                    algorithm="auto", invariant=True)


def ring(p: int, shift: int = 1):
    """ppermute pairs sending each rank's value `shift` ranks ahead."""
    return [(r, (r + shift) % p) for r in range(p)]


def vma(x) -> frozenset:
    return _jax.varying_axes(jax.typeof(x))


def make_varying(x, axes: tuple):
    """`x` typed as varying over `axes` (a no-op where it already is, or outside check_vma)."""
    missing = tuple(a for a in axes if a not in vma(x))
    if not missing or not _jax.check_vma():  # no typing to satisfy (custom_partitioning, check_vma=False)
        return x
    return lax.pcast(x, missing, to="varying")


def match_vma(ct, like_vma: frozenset):
    """The cotangent of a primal typed `like_vma`: summed over the axes the primal was invariant over (the
    transpose of using one value on every rank), and made varying where the primal was."""
    extra = tuple(sorted(vma(ct) - like_vma))
    if extra:
        ct = all_reduce(ct, extra if len(extra) > 1 else extra[0])
    return make_varying(ct, tuple(sorted(like_vma)))


def vary(x, axes: tuple):
    """`x` typed varying over `axes` where it is invariant: what jax does implicitly when an invariant value
    (a replicated scale, bias) meets a rank's rows, but with the transpose, the sum of every rank's cotangent,
    on jaxcoll's all-reduce instead of lax.psum."""
    missing = tuple(a for a in axes if a not in vma(x))
    if not missing or not _jax.check_vma():
        return x
    return pvary.bind(x, axes=missing)


def rank_rows(v, axis_name, start: int, block: int):
    """Rows [start + r * block, start + (r + 1) * block) of `v` on rank r. Where `v` is invariant over
    `axis_name` (the same on every rank) the transpose is the invariant all-gather of the rows' cotangents
    (what lax would do with a psum of zero-padded slices, at half the bytes); where it varies, a plain slice."""
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    if not _jax.check_vma() or set(axes) & vma(v):
        return lax.dynamic_slice_in_dim(v, start + lax.axis_index(axis_name) * block, block, axis=0)
    return _rank_rows(v, axis_name, start, block, v.shape[0])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _rank_rows(v, axis_name, start, block, rows):
    return lax.dynamic_slice_in_dim(v, start + lax.axis_index(axis_name) * block, block, axis=0)


def _rank_rows_fwd(v, axis_name, start, block, rows):
    return _rank_rows(v, axis_name, start, block, rows), None


def _rank_rows_bwd(axis_name, start, block, rows, _, ct):
    gathered = all_gather_invariant(ct, axis_name, 0)  # every rank's rows, in rank order: [start, start + p block)
    zeros = jax.numpy.zeros((rows,) + ct.shape[1:], ct.dtype)
    return (lax.dynamic_update_slice_in_dim(zeros, gathered, start, axis=0),)


_rank_rows.defvjp(_rank_rows_fwd, _rank_rows_bwd)


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
