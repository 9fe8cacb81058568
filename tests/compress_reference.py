"""numpy references of the compressed wire formats and of their error bounds, of the sparse all-reduce and of
Adasum, written from the descriptions in docs/compression.md, independently of the jax code they check."""

from __future__ import annotations

import ml_dtypes
import numpy as np


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


def numpy_threshold(x, k, threshold=None, sample=65536, run=64):
    """The selection threshold of one rank's x (L,), as a float32 magnitude: the ceil(k S / L)-th largest |x| of
    S = min(L, sample) entries (all of x, or sample / run runs of `run` consecutive entries, run r starting at
    floor(r L / (sample / run))), at least `threshold` and the least positive float, at most inf (NaN compares
    above inf: magnitudes are compared as their float32 bits)."""
    length = x.size
    s = min(length, sample)
    if length <= sample:
        chosen = x
    else:
        runs = sample // run
        chosen = np.concatenate([x[r * length // runs:][:run] for r in range(runs)])
    bits = np.sort(np.abs(chosen).view(np.uint32))[::-1]
    t = int(bits[-(-k * s // length) - 1])
    t = max(t, 1, int(np.float32(threshold or 0).view(np.uint32)))
    return np.uint32(min(t, 0x7F800000)).view(np.float32)


def numpy_topk(x, k, threshold=None, slack=2, sample=65536, details=False):
    """Reference of the sparse all-reduce on x (N, L): (result, residuals), written from the description in
    docs/compression.md: every rank selects the entries whose magnitude reaches its threshold (numpy_threshold;
    inf and NaN always), puts them in index order into the bucket of their region (element i belongs to region
    (i // 16) % N, of ceil(L / 16N) 16 positions) up to slack * ceil(k/N) of them; each owner sums its buckets'
    values per index in rank order in float32 and keeps the ceil(k/N) largest magnitudes (NaN first, then ties to
    the lower index); the result holds the kept sums, and an entry leaves its rank's residual when it was sent
    and kept. With details=True also returns the
    selected, sent and kept masks."""
    n, length = x.shape
    owner = np.arange(length) // 16 % n
    region = -(-length // (16 * n)) * 16  # positions a region has
    capacity = min(region, slack * -(-k // n))
    keep = min(region, -(-k // n))
    magnitude = np.abs(x).view(np.uint32)  # ordered as the magnitudes, NaN above inf
    selected = np.stack([magnitude[r] >= numpy_threshold(x[r], k, threshold, sample).view(np.uint32)
                         for r in range(n)])
    sent = np.zeros_like(selected)
    for r in range(n):
        for p in range(n):
            sent[r, np.nonzero(selected[r] & (owner == p))[0][:capacity]] = True
    total = np.zeros(length, np.float32)
    for r in range(n):  # in rank order, one float32 add at a time
        total[sent[r]] += x[r, sent[r]]
    touched = sent.any(0)
    kept = np.zeros(length, bool)
    for p in range(n):
        idx = np.nonzero(touched & (owner == p))[0]
        mag = np.abs(total[idx]).view(np.uint32)
        order = np.lexsort((idx, -mag.astype(np.int64)))  # largest magnitude first, then the lower index
        kept[idx[order[:keep]]] = True
    result = np.where(kept, total, np.float32(0)).astype(np.float32)
    residual = np.where(sent & kept, np.float32(0), x).astype(np.float32)
    if details:
        return result, residual, dict(selected=selected, sent=sent, kept=kept)
    return result, residual


def numpy_adasum(gs):
    """The recursive pairwise formula over halves, in float64."""
    if len(gs) == 1:
        return gs[0]
    a, b = numpy_adasum(gs[:len(gs) // 2]), numpy_adasum(gs[len(gs) // 2:])
    dot = a @ b
    ca = 1 - dot / (2 * (a @ a)) if a @ a > 0 else 1.0
    cb = 1 - dot / (2 * (b @ b)) if b @ b > 0 else 1.0
    return ca * a + cb * b
