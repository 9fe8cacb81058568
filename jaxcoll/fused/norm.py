"""reduce_scatter_norm_all_gather: the all-reduce after a row-parallel layer, fused with the bias, residual add
and row-wise norm that follow it (CoCoNet's model-parallel fusion, Megatron's sequence parallelism): the sum is
reduce-scattered over rows, each rank adds and normalizes only its 1/p of the rows, and an all-gather returns
the rows. Same bytes as one all-reduce; the epilogue's work is divided by p. The all-gather is the invariant
one, so the result is typed as `lax.psum`'s would be.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcoll.fused import comm
from jaxcoll.fused.collective_matmul import _acc_dtype, _axes

API = "jaxcoll.fused.reduce_scatter_norm_all_gather"
NORMS = ("rmsnorm", "layernorm")


def row_norm(h, scale, offset, norm: str, eps: float):
    """RMSNorm or LayerNorm over the last dimension, computed in at least float32."""
    dtype = h.dtype
    h = h.astype(_acc_dtype(dtype))
    if norm == "rmsnorm":
        y = h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
    else:
        mu = jnp.mean(h, axis=-1, keepdims=True)
        c = h - mu
        y = c * lax.rsqrt(jnp.mean(c * c, axis=-1, keepdims=True) + eps)
    y = y * scale.astype(y.dtype)
    if offset is not None:
        y = y + offset.astype(y.dtype)
    return y.astype(dtype)


def check_epilogue(api: str, x, name, v, shape):
    """Trace-time errors naming the operand: an epilogue operand `v` (None: absent) has x's dtype and `shape`."""
    if v is None:
        return
    if np.dtype(v.dtype) != np.dtype(x.dtype):
        raise TypeError(f"{api}: {name}.dtype={np.dtype(v.dtype).name} must equal x.dtype="
                        f"{np.dtype(x.dtype).name}")
    if tuple(v.shape) != tuple(shape):
        raise ValueError(f"{api}: {name}.shape={tuple(v.shape)} must be {tuple(shape)} for x.shape="
                         f"{tuple(x.shape)}")


def check_norm(api: str, norm: str, offset) -> None:
    if norm not in NORMS:
        raise ValueError(f"{api}: norm={norm!r} must be one of {NORMS}")
    if norm == "rmsnorm" and offset is not None:
        raise ValueError(f"{api}: offset is for norm='layernorm'; rmsnorm has only a scale")


def reduce_scatter_norm_all_gather(x, axis_name, *, scale, residual=None, bias=None, offset=None,
                                   norm: str = "rmsnorm", eps: float = 1e-6, return_residual: bool = False,
                                   chunks=None):
    """`h = lax.psum(x, axis_name) + bias + residual; norm(h) * scale (+ offset)`, as reduce-scatter, the
    epilogue on this rank's rows, all-gather.

    Use inside `jax.shard_map` over `axis_name` (group size p). `x` (rows..., H) holds this rank's partial
    sums (the output of a row-parallel product); its leading dimension must divide by p * chunks. `residual`
    has x's shape and is the same on every rank; `bias`, `scale`, `offset` have shape (H,). The norm is over
    the last dimension. The result has x's shape and, like `lax.psum`'s, is invariant over `axis_name`
    under `shard_map(check_vma=True)` (so `out_specs` may leave the axis out). With `return_residual=True` also returns h (the new
    residual stream), gathered in the same collective.

    `chunks`: row pieces pipelined through reduce-scatter, epilogue and all-gather; None and 1 mean one piece.
    """
    check_norm(API, norm, offset)
    if x.ndim < 2:
        raise ValueError(f"{API}: x must be (rows..., H), got x.shape={tuple(x.shape)}")
    h_dim = x.shape[-1]
    check_epilogue(API, x, "residual", residual, x.shape)
    for name, v in (("bias", bias), ("scale", scale), ("offset", offset)):
        check_epilogue(API, x, name, v, (h_dim,))
    p = lax.axis_size(axis_name)
    c = 1 if chunks is None else chunks
    if not isinstance(c, int) or isinstance(c, bool) or c < 1:
        raise ValueError(f"{API}: chunks={chunks!r} must be None or a positive integer")
    rows = x.shape[0]
    if rows % (p * c):
        raise ValueError(f"{API}: x.shape={tuple(x.shape)}: the leading dimension {rows} must divide by the "
                         f"group size {p} times chunks={c}")
    axes = _axes(axis_name)
    x = comm.make_varying(x, axes)
    # The epilogue's operands meet this rank's rows: their gradients sum over ranks on jaxcoll's collectives.
    bias, scale, offset = (None if v is None else comm.vary(v, axes) for v in (bias, scale, offset))
    piece, block = rows // c, rows // (c * p)
    outs, last = [], None
    for q in range(c):
        xq = x if c == 1 else lax.slice_in_dim(x, q * piece, (q + 1) * piece, axis=0)
        h = comm.reduce_scatter(comm.after(xq, last), axis_name, 0)
        if bias is not None:
            h = h + bias
        if residual is not None:
            h = h + comm.rank_rows(residual, axis_name, q * piece, block)
        y = row_norm(h, scale, offset, norm, eps)
        if return_residual:
            last = comm.all_gather_invariant(jnp.concatenate([y, h], axis=-1), axis_name, 0)
            outs.append((last[..., :h_dim], last[..., h_dim:]))
        else:
            last = comm.all_gather_invariant(y, axis_name, 0)
            outs.append((last, None))
    y = outs[0][0] if c == 1 else jnp.concatenate([o[0] for o in outs], axis=0)
    if not return_residual:
        return y
    h = outs[0][1] if c == 1 else jnp.concatenate([o[1] for o in outs], axis=0)
    return y, h
