"""numpy references of the compressed wire formats and of their error bounds, of the sparse all-reduce and of
Adasum, written from the descriptions in docs/compression.md, independently of the jax code they check."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from jaxcoll.compress.sparse import Layout

TINY = np.float32(2.0 ** -126)
CODE_MAX = {"int8": 127.0, "fp8": 448.0}


def blocks(x, block):
    return np.asarray(x, np.float32).reshape(-1, block)


def scales(x, fmt, block):
    """Per block: the float32 scale absmax / code_max (0 below the smallest normal, NaN if non-finite)."""
    b = blocks(x, block)
    with np.errstate(invalid="ignore"):
        absmax = np.max(np.abs(b), axis=1)
    s = (absmax / np.float32(CODE_MAX[fmt])).astype(np.float32)
    s = np.where(s >= TINY, s, np.float32(0))
    return np.where(np.isfinite(absmax), s, np.float32(np.nan)).astype(np.float32)


def flush(x):
    """XLA:CPU reads float32 subnormals as zero."""
    x = np.asarray(x, np.float32)
    return np.where(np.abs(x) < TINY, np.float32(0), x).astype(np.float32)


def roundtrip(x, fmt, block=256):
    """x after encode and decode in `fmt`, float32."""
    if fmt == "bf16":  # a conversion, no arithmetic: subnormals are rounded, not flushed
        return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    x = flush(x)
    b = blocks(x, block)
    s = scales(x, fmt, block)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        inverse = (np.float32(1) / np.where(s > 0, s, np.float32(1))).astype(np.float32)
        y = np.where(s > 0, b * inverse, 0).astype(np.float32)
        y = np.clip(y, -CODE_MAX[fmt], CODE_MAX[fmt])
        codes = np.round(y) if fmt == "int8" else y.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
        return (codes.astype(np.float32) * s).astype(np.float32).reshape(np.shape(x))


def bound(x, fmt, block=256):
    """The per-element error bound of formats.py's docstring, float64 (NaN where the block is non-finite)."""
    x64 = np.asarray(x, np.float64)
    if fmt == "bf16":
        return np.abs(x64) * 2.0 ** -8 + 2.0 ** -126  # + a subnormal read as zero
    b = np.abs(blocks(x, block)).astype(np.float64)
    with np.errstate(invalid="ignore"):
        absmax = np.max(b, axis=1, keepdims=True)
    s = absmax / CODE_MAX[fmt]
    if fmt == "int8":
        e = np.broadcast_to(s / 2, b.shape)
    else:
        e = np.maximum(b * 2.0 ** -4, s * 2.0 ** -10)
    e = e * (1 + 2.0 ** -15)
    e = np.where(b < 2.0 ** -126, np.maximum(e, 2.0 ** -126), e)  # a subnormal input reads as 0
    small = absmax < CODE_MAX[fmt] * 2.0 ** -126  # scale would be subnormal: the block encodes as zeros
    e = np.where(small, absmax, e)
    e = np.where(np.isfinite(absmax), e, np.nan)
    return e.reshape(np.shape(x))


def numpy_select(rows, threshold=None):
    """Per row: the first entry of largest magnitude, magnitudes compared as their float32 bits floored at
    2^-126 with the low b mantissa bits dropped (b = bits for the positions of a row); its index and value."""
    g = rows.shape[-1]
    bits = max(1, (g - 1).bit_length())
    magnitude = np.maximum(np.abs(rows).view(np.int32), 0x00800000) & ~((1 << bits) - 1)
    index = np.argmax(magnitude, axis=-1)  # the first of the largest
    value = np.take_along_axis(rows, index[..., None], -1)[..., 0]
    if threshold is not None:
        index = np.where(np.abs(value) >= threshold, index, g)
        value = np.where(index < g, value, 0).astype(np.float32)
    return index, value


def numpy_topk(x, k, threshold=None):
    """Reference of the sparse all-reduce on x (N, L): (result, residuals), from the module's description:
    per group of ceil(L/k) elements each rank selects an entry (numpy_select), the owner sums the selections in
    rank order in float32 and selects again; kept entries leave the residuals."""
    n, length = x.shape
    lay = Layout.of(length, k, n)
    g = lay.size
    blocks = np.zeros((n, lay.groups * g), np.float32)
    blocks[:, :length] = x
    blocks = blocks.reshape(n, lay.groups, g)
    index = np.stack([numpy_select(blocks[r], threshold)[0] for r in range(n)])
    dense = np.zeros((lay.groups, g), np.float32)
    for r in range(n):
        rows = np.nonzero(index[r] < g)[0]
        dense[rows, index[r, rows]] += blocks[r, rows, index[r, rows]]
    kept, _ = numpy_select(dense)
    result = np.zeros_like(dense)
    result[np.arange(lay.groups), kept] = dense[np.arange(lay.groups), kept]
    residual = blocks.copy()
    for r in range(n):
        rows = np.nonzero(index[r] == kept)[0]
        residual[r, rows, kept[rows]] = 0
    return result.reshape(-1)[:length], residual.reshape(n, -1)[:, :length]


def numpy_adasum(gs):
    """The recursive pairwise formula over halves, in float64."""
    if len(gs) == 1:
        return gs[0]
    a, b = numpy_adasum(gs[:len(gs) // 2]), numpy_adasum(gs[len(gs) // 2:])
    dot = a @ b
    ca = 1 - dot / (2 * (a @ a)) if a @ a > 0 else 1.0
    cb = 1 - dot / (2 * (b @ b)) if b @ b > 0 else 1.0
    return ca * a + cb * b
