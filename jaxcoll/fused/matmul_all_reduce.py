"""matmul_all_reduce: a row-parallel product summed over the tensor-parallel group, with the bias and residual
epilogue, overlapped by splitting the rows: the all-reduce of one row piece runs while the next piece's
product computes (CoCoNet's "matmul + all-reduce" overlap).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcoll.fused import chunks as chunking
from jaxcoll.fused import comm
from jaxcoll.fused.collective_matmul import _axes, _dot, check_matmul_operands

API = "jaxcoll.fused.matmul_all_reduce"


def _check_epilogue(name, v, shape, dtype):
    if v is None:
        return
    if np.dtype(v.dtype) != np.dtype(dtype):
        raise TypeError(f"{API}: {name}.dtype={np.dtype(v.dtype).name} must equal the product's dtype "
                        f"{np.dtype(dtype).name}")
    try:
        out = np.broadcast_shapes(tuple(v.shape), shape)
    except ValueError:
        out = None
    if out != shape:
        raise ValueError(f"{API}: {name}.shape={tuple(v.shape)} does not broadcast to the product's shape "
                         f"{shape}")


def matmul_all_reduce(x, w, axis_name, *, bias=None, residual=None, chunks=None):
    """`lax.psum(x @ w, axis_name) + bias + residual`, overlapped.

    Use inside `jax.shard_map` over `axis_name`: x and w hold this rank's slice of the contraction
    dimension. `bias` and `residual` (optional) broadcast to the product's shape and are added once, after
    the sum. The result is invariant over `axis_name`, like `lax.psum`'s.

    `chunks`: the number of pieces x's leading dimension is split into (each piece's product is summed while
    the next computes); None picks by platform and size (`jaxcoll.fused.chunks`), 1 is no overlap.
    """
    check_matmul_operands(API, x, w)
    shape = tuple(x.shape[:-1]) + (w.shape[1],)
    _check_epilogue("bias", bias, shape, x.dtype)
    _check_epilogue("residual", residual, shape, x.dtype)
    p = lax.axis_size(axis_name)
    if chunks is not None and chunks != 1 and x.ndim < 2:
        raise ValueError(f"{API}: chunks={chunks} splits x's leading dimension, but x.shape={tuple(x.shape)} "
                         f"has no leading dimension")
    rows = x.shape[0] if x.ndim > 1 else 1
    piece_bytes = int(np.prod(shape)) // p * np.dtype(x.dtype).itemsize
    chunks = chunking.choose_pieces(API, chunks, p, piece_bytes, rows, f"x's leading dimension (x.shape="
                                    f"{tuple(x.shape)})")
    x = comm.make_varying(x, _axes(axis_name))
    m = rows // chunks
    pieces = [x] if chunks == 1 else [lax.slice_in_dim(x, j * m, (j + 1) * m, axis=0) for j in range(chunks)]
    summed, last = [], None
    for piece in pieces:
        last = comm.all_reduce(comm.after(_dot(piece, w).astype(x.dtype), last), axis_name)
        summed.append(last)
    y = summed[0] if chunks == 1 else jnp.concatenate(summed, axis=0)
    if bias is not None:
        y = y + bias
    if residual is not None:
        y = y + residual
    return y
