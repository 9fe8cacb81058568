"""Hierarchical compressed all_reduce and reduce_scatter (`compress_axes=`): exact within the fast axes, compressed
only across the slow ones, as ZeRO++'s hpZ/qgZ keep the intra-node hop exact.

With axes = inner (fast, e.g. the devices of one process or host) and outer = compress_axes (slow, e.g. the
hosts), of L and O ranks:
  1. exact reduce_scatter over the inner axes (jaxcoll's own plan): rank i holds chunk i, 1/L of the data,
     summed exactly in float32 over its L inner peers;
  2. the compressed all_reduce (quantized.py's two qgZ hops, native codec) of that chunk over the outer axes;
     at O = 2 its one hop: one gather of the encoded chunk (codes and scales in one array), one decoding sum;
  3. exact all_gather over the inner axes, in the input's dtype (a float16/bfloat16 result in half the bytes).
Only hop 2 crosses the slow domain, and it carries the encoded 1/L chunk: 2 (O-1)/O wire_bytes(|x|/L) per rank
against 2 (N-1)/N wire_bytes(|x|) for the flat compressed path; the codec runs on |x|/L elements, not |x|.

reduce_scatter is steps 1 and hop 1 of 2: rank r ends with its exact-inner, compressed-outer piece. The rank
order is the one of the whole tuple `axes` (row-major, as lax.psum_scatter), so the pieces are reordered before
step 1 (one copy) when the inner axes do not come first in the tuple.

Error: only the outer hop's encodings count. With s_o = the exact float32 sum of x over the inner ranks of outer
rank o (the chunk step 1 gives), the bound of quantized.py holds with s_o in place of the ranks' x_r:
  all_reduce      |y - sum_r x_r| <= sum_o e(s_o) + e(sum_o s'_o) + float32 summation  (O = 2: no second term)
  reduce_scatter  |y - sum_r x_r| <= sum_o e(s_o) + float32 summation
where e is formats.py's bound over s_o's blocks: blocks of the chunk (step 1 splits |x| in L contiguous chunks
of whole blocks, the input zero-padded at the end to L whole blocks).

Derivatives are the exact collective's over all of `axes` (straight-through), as for the flat path.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxcoll import exact
from jaxcoll.compress import codec, quantized
from jaxcoll.compress.formats import Bf16, Format
from jaxcoll.lowering import groups


def split(axes: tuple, compress_axes: tuple) -> tuple:
    """(inner, outer): the axes summed exactly and the compressed ones, each in the order of `axes`."""
    return (tuple(a for a in axes if a not in compress_axes), tuple(a for a in axes if a in compress_axes))


def all_reduce(x, axes: tuple, compress_axes: tuple, fmt: Format):
    """The sum over `axes` of x, compressed over `compress_axes` only (arguments checked by the caller)."""
    def compressed(v):
        flat = v.astype(jnp.float32).reshape(-1)
        return sum_and_loss(flat, axes, compress_axes, fmt, dtype=v.dtype)[0].reshape(v.shape)

    return quantized.exact_derivative(compressed, lambda v: exact.all_reduce(v, axes), x)


def sum_and_loss(flat, axes: tuple, compress_axes: tuple, fmt: Format, *, loss: bool = False, dtype=jnp.float32):
    """(sum over `axes` of the float32 vector `flat` as `dtype`, what this rank's outer encoding lost or None):
    the loss is the encoding error of the chunk of the exact partial sum this rank encodes, at that chunk's place
    in a vector shaped like `flat` (zeros elsewhere). Added to this rank's next input, the exact inner hop carries
    it into the same chunk: error feedback (jaxcoll.optax.compressed_sync). No derivative rule.
    The sum is cast to `dtype` before the inner all_gather, not after: the same values (a cast commutes with a
    gather), and a float16/bfloat16 result crosses the fast axes in half the bytes."""
    inner, outer = split(axes, compress_axes)
    ell = groups.group_size(inner)
    block = 1 if isinstance(fmt, Bf16) else fmt.block_size
    size = flat.size
    padded = -(-size // (ell * block)) * ell * block  # L chunks of whole blocks
    if padded != size:
        flat = jnp.pad(flat, (0, padded - size))
    chunk = exact.reduce_scatter(flat, inner, scatter_dimension=0, tiled=True)
    summed = quantized.sum_flat(fmt, outer, chunk).astype(dtype)
    total = exact.all_gather(summed, inner, tiled=True, invariant=True)[:size]
    if not loss:
        return total, None
    lost_chunk = chunk - codec.roundtrip(fmt, lax.stop_gradient(chunk))
    at = lax.axis_index(inner) * chunk.size  # the exact reduce_scatter's rank order: row-major over `inner`
    lost = lax.dynamic_update_slice(jnp.zeros((padded,), jnp.float32), lost_chunk, (at,))
    return total, lost[:size]


def reduce_scatter(x, axes: tuple, compress_axes: tuple, fmt: Format, *, scatter_dimension: int, tiled: bool):
    """psum_scatter of x over `axes`, compressed over `compress_axes` only (arguments checked by the caller)."""
    inner, outer = split(axes, compress_axes)
    sizes = [groups.group_size((a,)) for a in axes]
    n = groups.group_size(axes)
    # Rank r's piece sits at index r of the scattered dimension, r row-major over `axes`; step 1 must hand inner
    # rank i the pieces of every outer rank with inner rank i, so the inner axes go first.
    order = [axes.index(a) for a in inner + outer]

    def compressed(v):
        moved = jnp.moveaxis(v, scatter_dimension, 0).astype(jnp.float32)
        per = moved.size // n
        pieces = moved.reshape(*sizes, per)
        if order != sorted(order):
            pieces = pieces.transpose(*order, len(axes))
        rows = pieces.reshape(n * per)
        chunk = exact.reduce_scatter(rows, inner, scatter_dimension=0, tiled=True)  # (O * per,)
        part = quantized.scatter_rows(fmt, outer, chunk.reshape(n // groups.group_size(inner), per))
        part = part.astype(v.dtype)
        if not tiled:
            return part.reshape(moved.shape[1:])
        return jnp.moveaxis(part.reshape((moved.shape[0] // n,) + moved.shape[1:]), 0, scatter_dimension)

    exact_rs = lambda v: exact.reduce_scatter(v, axes, scatter_dimension=scatter_dimension, tiled=tiled)  # noqa: E731
    return quantized.exact_derivative(compressed, exact_rs, x)
