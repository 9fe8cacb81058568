"""Quantized all_reduce, reduce_scatter and all_gather: the `compression=` path of the public collectives.

What travels between ranks is the encoded form (jaxcoll/compress/formats.py), moved by jaxcoll's own
collectives, in the two hops of ZeRO++'s qgZ scheme:
  1. each rank encodes its x in N chunks and sends chunk p to rank p (jaxcoll.all_to_all of wire rows: codes
     and scales in one array, codec.encode_wire, so one collective a hop);
  2. rank p decodes the N chunks it received, sums them in float32 (its reduce-scatter result), encodes the sum
     once and every rank gathers the encoded sums (jaxcoll all_gather), then decodes them.
So an element is encoded twice on its way (once per hop), and every rank decodes the same bytes: the results
are bitwise identical on every rank. Over 2 ranks all_reduce takes one hop instead (_gather_and_sum: both
ranks' encoded x gathered in the codec's wire form, the two decoded rows summed in rank order): the same bytes,
one exchange, one encoding. The passes over the data run through jaxcoll.compress.codec: native kernels on CPU
(all_reduce's decode-and-sum and its second encoding fused into one), formats.py's jax.numpy elsewhere. Traffic
per rank is 2 (N-1)/N wire_bytes(x) against 2 (N-1)/N 4|x| for float32, about 3.9x less for Int8/Fp8 with
block_size 256.

bf16 needs no scales and the runtime reduces bfloat16 in float32 and rounds once: it runs the exact collective
on bfloat16 data, so the plan's own hops carry it.

Error of all_reduce, per element (e(v) the bound of formats.py for element v in its block):
  |y - sum_r x_r| <= sum_r e(x_r) + e(sum_r x'_r)      (x'_r: rank r's decoded chunk; over 2 ranks the first
                                                        term alone, + float32 summation)
reduce_scatter has the first term only, all_gather the bound of one encoding.

Derivatives are those of the exact collective (straight-through): the tangent travels uncompressed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcoll import exact
from jaxcoll.compress import codec
from jaxcoll.compress.formats import Bf16, Format
from jaxcoll.lowering import groups


def exact_derivative(compressed, exact_collective, x):
    """compressed(x), differentiated as exact_collective(x) (linear: a collective of the tangent)."""
    f = jax.custom_jvp(compressed)
    f.defjvp(lambda primals, tangents: (f(*primals), exact_collective(*tangents)))
    return f(x)


def _exchange(axes: tuple, encoded):
    """Hop 1's move: `encoded` holds N wire rows on each rank, row p for rank p; returns the N rows this rank
    received, row q from rank q."""
    return exact.all_to_all(encoded, axes, 0, 0, tiled=True)


def _gather(fmt: Format, axes: tuple, wire, length: int, *, invariant: bool, kept: int | None = None):
    """Hop 2: every rank's wire row of `length` codes gathered and decoded: the N ranks' values one after
    another, the first `kept` (all N * length when not given)."""
    rows = exact.all_gather(wire[None], axes, tiled=True, invariant=invariant)
    return codec.decode_wire(fmt, rows, length, kept)


def _rows(fmt: Format, flat, n: int):
    """flat (a whole number of blocks) as N wire rows of `per` codes, whole blocks, zero-padded at the end;
    returns (rows, per). The float32 data is padded (one copy) only when no N chunks of whole blocks fit it."""
    per = -(-flat.size // (n * fmt.block_size)) * fmt.block_size  # a chunk is whole blocks
    if n * per != flat.size:
        flat = jnp.pad(flat, (0, n * per - flat.size))
    return codec.encode_wire(fmt, flat.reshape(n, per)), per


def sum_flat(fmt: Format, axes: tuple, flat):
    """float32 `flat` (whole blocks) summed over `axes` through wire format fmt: float32, invariant over `axes`,
    the same bytes on every rank. No derivative rule (the callers give the exact one); hierarchical.py runs it on
    the 1/L chunk of the outer axes."""
    if isinstance(fmt, Bf16):
        return exact.all_reduce(flat.astype(jnp.bfloat16), axes).astype(jnp.float32)
    n = groups.group_size(axes)
    if n == 2:
        return _gather_and_sum(fmt, axes, flat)
    # Hop 1's decode and sum and hop 2's encode are one pass: the float32 sum never goes to memory. Each hop
    # moves one array (the codec's wire form): one collective, where codes and scales apart took two.
    rows, per = _rows(fmt, flat, n)
    summed = codec.decode_sum_encode_wire(fmt, _exchange(axes, rows), per)
    return _gather(fmt, axes, summed, per, invariant=True, kept=flat.size)


def _gather_and_sum(fmt: Format, axes: tuple, flat):
    """sum_flat over two ranks in one hop: every rank gathers both ranks' encoded x and sums the two decoded rows
    in rank order. At N = 2 that sends what qgZ's two hops send (wire_bytes(x) a rank: half of x each way in
    hop 1, the encoded half-sum in hop 2), in one exchange instead of two, with one encoding per element instead
    of two (the bound loses its second term). Codes and scales travel as one array (codec's wire form): one
    collective, where two arrays took two. Across processes each collective is a rendezvous over the link, and
    the hierarchical path (hierarchical.py) runs this one at O = 2 hosts; at N > 2 gathering sends N/2 times
    more than the two hops, so they stay."""
    wire = exact.all_gather(codec.encode_wire(fmt, flat)[None], axes, tiled=True, invariant=True)
    return codec.decode_sum_wire(fmt, wire, flat.size)


def scatter_rows(fmt: Format, axes: tuple, rows):
    """float32 rows (N, per) -> row r of their sum over `axes` on rank r (per,): hop 1 of sum_flat alone, float32,
    varying over `axes`. No derivative rule."""
    if isinstance(fmt, Bf16):
        return exact.reduce_scatter(rows.astype(jnp.bfloat16), axes, scatter_dimension=0).astype(jnp.float32)
    # One array (the codec's wire form) crosses: one all_to_all where codes and scales apart took two.
    return codec.decode_sum_wire(fmt, _exchange(axes, codec.encode_wire(fmt, rows)), rows.shape[-1])


def all_reduce(x, axes: tuple, fmt: Format, algorithm="auto"):
    """The sum over `axes` of x, through wire format fmt (arguments checked by the caller)."""
    exact_sum = lambda v: exact.all_reduce(v, axes, algorithm=algorithm)  # noqa: E731
    if isinstance(fmt, Bf16):
        return exact_derivative(lambda v: exact_sum(v.astype(jnp.bfloat16)).astype(v.dtype), exact_sum, x)

    def compressed(v):
        return sum_flat(fmt, axes, v.astype(jnp.float32).reshape(-1)).reshape(v.shape).astype(v.dtype)

    return exact_derivative(compressed, exact_sum, x)


def reduce_scatter(x, axes: tuple, fmt: Format, *, scatter_dimension: int, tiled: bool, algorithm="auto"):
    """psum_scatter of x over `axes` through wire format fmt (arguments checked by the caller)."""
    exact_rs = lambda v: exact.reduce_scatter(v, axes, scatter_dimension=scatter_dimension,  # noqa: E731
                                              tiled=tiled, algorithm=algorithm)
    if isinstance(fmt, Bf16):
        return exact_derivative(lambda v: exact_rs(v.astype(jnp.bfloat16)).astype(v.dtype), exact_rs, x)
    n = groups.group_size(axes)

    def compressed(v):
        moved = jnp.moveaxis(v, scatter_dimension, 0)
        out_shape = ((moved.shape[0] // n,) if tiled else ()) + moved.shape[1:]
        rows = moved.astype(jnp.float32).reshape(n, moved.size // n)
        part = scatter_rows(fmt, axes, rows).reshape(out_shape).astype(v.dtype)
        return jnp.moveaxis(part, 0, scatter_dimension) if tiled else part

    return exact_derivative(compressed, exact_rs, x)


def all_gather(x, axes: tuple, fmt: Format, *, axis: int, tiled: bool, algorithm="auto"):
    """all_gather of x over `axes` through wire format fmt (arguments checked by the caller)."""
    exact_ag = lambda v: exact.all_gather(v, axes, axis=axis, tiled=tiled, algorithm=algorithm)  # noqa: E731
    if isinstance(fmt, Bf16):
        return exact_derivative(lambda v: exact_ag(v.astype(jnp.bfloat16)).astype(v.dtype), exact_ag, x)
    n = groups.group_size(axes)

    def compressed(v):
        flat = v.astype(jnp.float32).reshape(-1)
        stacked = _gather(fmt, axes, codec.encode_wire(fmt, flat), flat.size, invariant=False)
        stacked = stacked.reshape(n, *v.shape).astype(v.dtype)
        if not tiled:
            return jnp.moveaxis(stacked, 0, axis)
        moved = jnp.moveaxis(stacked, 0, axis)
        shape = list(v.shape)
        shape[axis] *= n
        return moved.reshape(shape)

    return exact_derivative(compressed, exact_ag, x)


def wire_bytes(fmt: Format, collective: str, elements: int, n: int) -> int:
    """Bytes one rank sends to others for one call on `elements` float elements per rank (the traffic the
    benchmark reports): all_reduce two hops, reduce_scatter and all_gather one."""
    if isinstance(fmt, Bf16):
        per_hop = 2 * elements * (n - 1) // n
        return {"all_reduce": 2 * per_hop, "reduce_scatter": per_hop, "all_gather": 2 * elements * (n - 1)}[
            collective]
    if collective == "all_reduce" and n == 2:  # one hop (_gather_and_sum): the whole encoded x to the other rank
        return codec.wire_row_bytes(fmt, elements)
    per = -(-elements // (n * fmt.block_size)) * fmt.block_size
    hop = (n - 1) * fmt.wire_bytes(per)
    return {"all_reduce": 2 * hop, "reduce_scatter": hop,
            "all_gather": (n - 1) * fmt.wire_bytes(elements)}[collective]

