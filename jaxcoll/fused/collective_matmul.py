"""Collective matmul: an all-gather feeding a matrix product, and a matrix product feeding a reduce-scatter,
overlapped by splitting the product along the communicated dimension and passing the pieces around a ring
(Wang et al., "Overlap communication with dependent computation via decomposition", ASPLOS 2023; the
pattern of TransformerEngine's comm+GEMM overlap and PyTorch's async tensor parallelism).

In `all_gather_matmul` a rank multiplies the block it holds while that block travels on to the next rank;
in `matmul_reduce_scatter` a rank adds its product of the next block to the partial sum arriving from the
previous rank and sends it on. In both, the send of step t and the product of step t (or t+1) have no data
dependency, so the runtime may run them at the same time. The two ops are each other's VJP.

The matrix product contracts the last dimension of `x` with the first of `w` (`x @ w`, w two-dimensional).
Partial products of 16-bit floats accumulate, and travel, in float32 and round once at the end.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcoll.fused import chunks as chunking
from jaxcoll.fused import comm


def _axes(axis_name) -> tuple:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _acc_dtype(dtype):
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
        return np.dtype(np.float32)
    return dtype


def check_matmul_operands(api_name: str, x, w, k_expected: int | None = None) -> None:
    """Trace-time errors naming the shapes and dtypes: w is 2-D, dtypes agree, contraction dims match."""
    if np.ndim(w) != 2:
        raise ValueError(f"{api_name}: w must be two-dimensional (K, N), got w.shape={tuple(np.shape(w))}")
    if np.ndim(x) < 1:
        raise ValueError(f"{api_name}: x must have at least one dimension, got x.shape={tuple(np.shape(x))}")
    xd, wd = np.dtype(x.dtype), np.dtype(w.dtype)
    if xd != wd:
        raise TypeError(f"{api_name}: x.dtype={xd.name} and w.dtype={wd.name} must be the same; cast one "
                        f"(x.shape={tuple(x.shape)}, w.shape={tuple(w.shape)})")
    if not (jnp.issubdtype(xd, jnp.floating) or jnp.issubdtype(xd, jnp.integer)):
        raise TypeError(f"{api_name}: dtype={xd.name} is not a number type a matrix product can use")
    k = x.shape[-1] if k_expected is None else k_expected
    if w.shape[0] != k:
        raise ValueError(f"{api_name}: contraction dimensions differ: x.shape={tuple(x.shape)} contracts "
                         f"{k} elements but w.shape={tuple(w.shape)} has {w.shape[0]} rows")


def _dot(a, w):
    """a @ w in the accumulation type (contract a's last dimension with w's first)."""
    return lax.dot_general(a, w, (((a.ndim - 1,), (0,)), ((), ())),
                           preferred_element_type=_acc_dtype(a.dtype))


def _contract_leading(a, b, out_dtype):
    """sum over all but the last dimension of a[..., k] b[..., n] -> (k, n): the weight gradient."""
    lead = tuple(range(a.ndim - 1))
    return lax.dot_general(a, b, ((lead, lead), ((), ())),
                           preferred_element_type=_acc_dtype(out_dtype)).astype(out_dtype)


def _normalize_axis(api_name: str, axis: int, ndim: int, what: str) -> int:
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise ValueError(f"{api_name}: {what}={axis!r} is out of range for an operand of rank {ndim}")
    return int(axis) % ndim


# ---------------------------------------------------------------------------------------------- all-gather


def _all_gather_matmul_ring(x, w, axis_name, g, chunks, want_gathered):
    p = lax.axis_size(axis_name)
    dtype = x.dtype
    contract = g == x.ndim - 1
    if chunks == 1:
        xg = comm.all_gather(x, axis_name, g)
        return _dot(xg, w).astype(dtype), (xg if want_gathered else None)

    idx = lax.axis_index(axis_name)
    n = x.shape[g]
    s = chunks // p
    m = n // s
    cur = [lax.slice_in_dim(x, j * m, (j + 1) * m, axis=g) for j in range(s)]
    gathered_shape = x.shape[:g] + (n * p,) + x.shape[g + 1:]
    if contract:
        acc = None
    else:
        out = jnp.zeros(gathered_shape[:-1] + (w.shape[1],), dtype)
    xg = jnp.zeros(gathered_shape, dtype) if want_gathered else None
    for t in range(p):
        # Issue the next hop first: it depends only on the pieces already here, not on this step's product.
        nxt = None
        if t < p - 1:
            nxt, last = [], None
            for c in cur:
                last = comm.ppermute(comm.after(c, last), axis_name, comm.ring(p))
                nxt.append(last)
        src = (idx - t) % p
        for j, piece in enumerate(cur):
            at = src * n + j * m
            if contract:
                part = _dot(piece, lax.dynamic_slice_in_dim(w, at, m, axis=0))
                acc = part if acc is None else acc + part
            else:
                out = lax.dynamic_update_slice_in_dim(out, _dot(piece, w).astype(dtype), at, axis=g)
            if want_gathered:
                xg = lax.dynamic_update_slice_in_dim(xg, piece, at, axis=g)
        cur = nxt
    if contract:
        out = acc.astype(dtype)
    return out, xg


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6, 7))
def _all_gather_matmul(x, w, axis_name, g, chunks, return_gathered, x_vma, w_vma):
    y, xg = _all_gather_matmul_ring(x, w, axis_name, g, chunks, return_gathered)
    return (y, xg) if return_gathered else y


def _all_gather_matmul_fwd(x, w, axis_name, g, chunks, return_gathered, x_vma, w_vma):
    y, xg = _all_gather_matmul_ring(x, w, axis_name, g, chunks, True)
    return ((y, xg) if return_gathered else y), (xg, w)


def _all_gather_matmul_bwd(axis_name, g, chunks, return_gathered, x_vma, w_vma, res, ct):
    xg, w = res
    dy, dxg = ct if return_gathered else (ct, None)
    # d(xg @ w)/dxg = dy @ w.T, and the transpose of the all-gather is a reduce-scatter: the partner op.
    dx = matmul_reduce_scatter(dy, w.T, axis_name, scatter_axis=g, chunks=chunks)
    if dxg is not None:
        dx = dx + comm.reduce_scatter(comm.after(dxg, dx), axis_name, g)
    dw = _contract_leading(xg, dy, w.dtype)
    # dw's all-reduce (a replicated w) is chained after dx's collectives: one order on every rank.
    return comm.match_vma(dx, x_vma), comm.match_vma(comm.after(dw, dx), w_vma)


_all_gather_matmul.defvjp(_all_gather_matmul_fwd, _all_gather_matmul_bwd)


def all_gather_matmul(x, w, axis_name, *, gather_axis: int = 0, return_gathered: bool = False, chunks=None):
    """`lax.all_gather(x, axis_name, axis=gather_axis, tiled=True) @ w`, overlapped.

    Use inside `jax.shard_map` over `axis_name` (group size p). `x` is this rank's block; `w` has shape
    (K, N) where K is x's last dimension, or p times it when `gather_axis` is x's last dimension (the product
    then sums the blocks' partial products). Returns the product, typed varying over `axis_name` like
    `lax.all_gather`'s result; with `return_gathered=True` also the gathered x.

    `chunks`: None picks by size; 1 gathers everything, then multiplies (no overlap); a multiple of p runs the
    ring with `chunks // p` pieces per block.
    """
    api = "jaxcoll.fused.all_gather_matmul"
    axes = _axes(axis_name)
    g = _normalize_axis(api, gather_axis, np.ndim(x), "gather_axis")
    p = lax.axis_size(axis_name)
    check_matmul_operands(api, x, w, k_expected=x.shape[-1] * p if g == np.ndim(x) - 1 else None)
    block_bytes = int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
    c = chunking.choose(api, chunks, p, block_bytes, x.shape[g], f"gather_axis={gather_axis} of x.shape="
                        f"{tuple(x.shape)}")
    x = comm.make_varying(x, axes)
    return _all_gather_matmul(x, w, axis_name, g, c, bool(return_gathered), comm.vma(x), comm.vma(w))


# ------------------------------------------------------------------------------------------ reduce-scatter


def _matmul_reduce_scatter_ring(x, w, axis_name, a, chunks):
    p = lax.axis_size(axis_name)
    dtype = x.dtype
    if chunks == 1:
        return comm.reduce_scatter(_dot(x, w).astype(dtype), axis_name, a)

    idx = lax.axis_index(axis_name)
    full = x.shape[:-1] + (w.shape[1],)
    block = full[a] // p
    s = chunks // p
    m = block // s
    on_w = a == x.ndim - 1  # scattering the product's columns: slice w's columns, not x's rows

    def partial_product(b, j):
        at = b * block + j * m
        if on_w:
            return _dot(x, lax.dynamic_slice_in_dim(w, at, m, axis=1))
        return _dot(lax.dynamic_slice_in_dim(x, at, m, axis=a), w)

    # Rank r's partial sum for block b leaves it at step t = r - b - 1 and returns to rank b after p hops.
    acc = [partial_product((idx - 1) % p, j) for j in range(s)]
    for t in range(1, p):
        b = (idx - t - 1) % p
        arrived, last = [], None
        for c in acc:
            last = comm.ppermute(comm.after(c, last), axis_name, comm.ring(p))
            arrived.append(last)
        acc = [arrived[j] + partial_product(b, j) for j in range(s)]
    return jnp.concatenate(acc, axis=a).astype(dtype) if s > 1 else acc[0].astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def _matmul_reduce_scatter(x, w, axis_name, a, chunks, x_vma, w_vma):
    return _matmul_reduce_scatter_ring(x, w, axis_name, a, chunks)


def _matmul_reduce_scatter_fwd(x, w, axis_name, a, chunks, x_vma, w_vma):
    return _matmul_reduce_scatter_ring(x, w, axis_name, a, chunks), (x, w)


def _matmul_reduce_scatter_bwd(axis_name, a, chunks, x_vma, w_vma, res, dy):
    x, w = res
    # The transpose of the reduce-scatter is an all-gather of dy, which then meets w.T: the partner op.
    dx, dyg = all_gather_matmul(dy, w.T, axis_name, gather_axis=a, return_gathered=True, chunks=chunks)
    dw = _contract_leading(x, dyg, w.dtype)
    return comm.match_vma(dx, x_vma), comm.match_vma(comm.after(dw, dx), w_vma)


_matmul_reduce_scatter.defvjp(_matmul_reduce_scatter_fwd, _matmul_reduce_scatter_bwd)


def matmul_reduce_scatter(x, w, axis_name, *, scatter_axis: int = 0, chunks=None):
    """`lax.psum_scatter(x @ w, axis_name, scatter_dimension=scatter_axis, tiled=True)`, overlapped.

    Use inside `jax.shard_map` over `axis_name` (group size p): each rank holds a partial product (typically x
    and w sharded along the contraction dimension); the result is this rank's block of the sum, with the
    product's dimension `scatter_axis` divided by p.

    `chunks`: None picks by size; 1 multiplies, then reduce-scatters (no overlap); a multiple of p runs the
    ring with `chunks // p` pieces per block.
    """
    api = "jaxcoll.fused.matmul_reduce_scatter"
    axes = _axes(axis_name)
    check_matmul_operands(api, x, w)
    full = tuple(x.shape[:-1]) + (w.shape[1],)
    a = _normalize_axis(api, scatter_axis, len(full), "scatter_axis")
    p = lax.axis_size(axis_name)
    if full[a] % p:
        raise ValueError(f"{api}: the product x @ w has shape {full} (x.shape={tuple(x.shape)}, "
                         f"w.shape={tuple(w.shape)}); its scatter_axis={scatter_axis} extent {full[a]} is not "
                         f"divisible by the group size {p}")
    block_bytes = int(np.prod(full)) // p * np.dtype(_acc_dtype(x.dtype)).itemsize
    c = chunking.choose(api, chunks, p, block_bytes, full[a] // p,
                        f"scatter_axis={scatter_axis} of the product's block")
    x = comm.make_varying(x, axes)
    return _matmul_reduce_scatter(x, w, axis_name, a, c, comm.vma(x), comm.vma(w))
