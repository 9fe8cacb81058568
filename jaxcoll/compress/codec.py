"""The codec of the block formats (Int8, Fp8): the encode, decode and decode-and-sum passes of the quantized
collectives (quantized.py), run by native kernels on CPU and by formats.py's jax.numpy elsewhere.

On CPU each pass is one call of an XLA FFI target (csrc/codec.cc through xla_ffi/codec_handlers.cc, registered by
jaxcoll.runtime): a loop over blocks that reads its input once and writes its output once, where XLA:CPU ran
the same formulas as several loops. On other platforms (`lax.platform_dependent`'s default) the jax.numpy
definitions run, which XLA:GPU fuses well. The two are bitwise equal on CPU, NaNs and signed zeros included:
the kernels repeat formats.py's operations in its order, with XLA:CPU's flush-to-zero and its fused
multiply-adds (tests/test_compress_codec.py).

Shapes: a format encodes the last axis, in blocks of fmt.block_size; leading axes are rows (vmap adds one).
Codes are int8 for Int8 and uint8 (e4m3 bits) for Fp8; the FFI targets read the format from that type.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcoll import _jax
from jaxcoll.compress.formats import Bf16, Format, roundtrip as jnp_roundtrip
from jaxcoll.lowering import groups
from jaxcoll.plan import abi


def _native(target: str, results, *operands, block_size: int, **attributes):
    # broadcast_all: a batched call gets every operand with the batch axes in front, which the kernels read as
    # more rows.
    # Imported here, not at the top: `import jaxcoll` must not load the native module (jaxcoll.runtime checks the
    # running jaxlib when it loads it); the first native call registers the targets, before anything compiles.
    from jaxcoll import runtime
    runtime.register()
    call = jax.ffi.ffi_call(target, results, vmap_method="broadcast_all")
    out = call(*operands, block_size=np.int64(block_size), **{k: np.int64(v) for k, v in attributes.items()})
    # Under shard_map(check_vma=True) ffi_call types its results invariant; they vary where the operands do,
    # as the jax.numpy branch's results would.
    axes = tuple(sorted(frozenset().union(*(_jax.varying_axes(jax.typeof(v)) for v in operands))))
    return jax.tree_util.tree_map(lambda o: groups.pvary_missing(o, axes), out)


def _codes_type(fmt: Format, codes_shape) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(codes_shape, fmt.code_dtype)


def _scales_type(fmt: Format, codes_shape) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(codes_shape[:-1] + (codes_shape[-1] // fmt.block_size,), jnp.float32)


def encode(fmt: Format, x, padded: int | None = None):
    """(codes, scales) of float32 x along its last axis (whole blocks), that axis extended with zero blocks
    (zero codes, zero scales: the encoding of zeros) to `padded` codes when given."""
    length = x.shape[-1]
    padded = length if padded is None else padded
    shape = x.shape[:-1] + (padded,)

    def jnp_encode(x):
        codes, scales = fmt.encode(x)
        pad = [(0, 0)] * (x.ndim - 1)
        return (jnp.pad(codes, pad + [(0, padded - length)]),
                jnp.pad(scales, pad + [(0, (padded - length) // fmt.block_size)]))

    def native_encode(x):
        return tuple(_native(abi.CODEC_ENCODE_TARGET, (_codes_type(fmt, shape), _scales_type(fmt, shape)), x,
                             block_size=fmt.block_size))

    return lax.platform_dependent(x, cpu=native_encode, default=jnp_encode)


def decode(fmt: Format, codes, scales, kept: int | None = None):
    """float32 values of (codes, scales) along the last axis: the first `kept` of each row when given."""
    kept = codes.shape[-1] if kept is None else kept

    def jnp_decode(codes, scales):
        return fmt.decode(codes, scales)[..., :kept]

    def native_decode(codes, scales):
        out = jax.ShapeDtypeStruct(codes.shape[:-1] + (kept,), jnp.float32)
        return _native(abi.CODEC_DECODE_TARGET, out, codes, scales, block_size=fmt.block_size)

    return lax.platform_dependent(codes, scales, cpu=native_decode, default=jnp_decode)


def _jnp_decode_sum(fmt: Format, codes, scales):
    decoded = fmt.decode(codes, scales)
    # Row by row, in rank order: XLA:CPU runs a sum over an axis as a strided reduction, 50x slower here than
    # these adds, which fuse into one loop (4M elements a rank).
    part = decoded[..., 0, :]
    for p in range(1, decoded.shape[-2]):
        part = part + decoded[..., p, :]
    return part


def decode_sum(fmt: Format, codes, scales):
    """codes (..., N, L) and their scales -> float32 (..., L): the decoded rows summed in row order
    (row 0 + row 1 + ...), in one pass on CPU."""

    def native_decode_sum(codes, scales):
        out = jax.ShapeDtypeStruct(codes.shape[:-2] + codes.shape[-1:], jnp.float32)
        return _native(abi.CODEC_DECODE_SUM_TARGET, out, codes, scales, block_size=fmt.block_size)

    return lax.platform_dependent(codes, scales, cpu=native_decode_sum,
                                  default=lambda c, s: _jnp_decode_sum(fmt, c, s))


def decode_sum_encode(fmt: Format, codes, scales):
    """encode(decode_sum(codes, scales)): on CPU one pass in which the sum never goes to memory."""

    def native_decode_sum_encode(codes, scales):
        shape = codes.shape[:-2] + codes.shape[-1:]
        return tuple(_native(abi.CODEC_DECODE_SUM_ENCODE_TARGET, (_codes_type(fmt, shape), _scales_type(fmt, shape)),
                             codes, scales, block_size=fmt.block_size))

    return lax.platform_dependent(codes, scales, cpu=native_decode_sum_encode,
                                  default=lambda c, s: fmt.encode(_jnp_decode_sum(fmt, c, s)))


def wire_row_bytes(fmt: Format, length: int) -> int:
    """Bytes of a wire row of `length` codes (csrc/codec.hpp): the codes, zero bytes up to a multiple of 4, then
    the length / block_size float32 scales."""
    return _wire_scales_at(length) + 4 * (length // fmt.block_size)


def _wire_scales_at(length: int) -> int:
    return -(-length // 4) * 4


def encode_wire(fmt: Format, x):
    """The wire form of float32 x (last axis whole blocks): encode(fmt, x) as one array of fmt.code_dtype whose
    rows hold the codes, zero bytes up to a multiple of 4, then the scales' bytes (wire_row_bytes each), so that
    one collective moves both (across processes: one rendezvous instead of two)."""
    shape = x.shape[:-1] + (wire_row_bytes(fmt, x.shape[-1]),)

    def native_encode_wire(x):
        return _native(abi.CODEC_ENCODE_WIRE_TARGET, jax.ShapeDtypeStruct(shape, fmt.code_dtype), x,
                       block_size=fmt.block_size)

    return lax.platform_dependent(x, cpu=native_encode_wire, default=lambda v: jnp_encode_wire(fmt, v))


def decode_sum_wire(fmt: Format, wire, length: int):
    """Wire rows (..., N, wire_row_bytes(length)) of `length` codes -> float32 (..., length): decode_sum of their
    codes and scales (the rows summed in row order), bit for bit."""

    def native_decode_sum_wire(wire):
        out = jax.ShapeDtypeStruct(wire.shape[:-2] + (length,), jnp.float32)
        return _native(abi.CODEC_DECODE_SUM_WIRE_TARGET, out, wire, block_size=fmt.block_size)

    return lax.platform_dependent(wire, cpu=native_decode_sum_wire,
                                  default=lambda w: jnp_decode_sum_wire(fmt, w, length))


def decode_sum_encode_wire(fmt: Format, wire, length: int):
    """Wire rows (..., N, W) of `length` codes -> one wire row (..., W): encode_wire(decode_sum_wire(...)), the
    float32 sum never in memory on CPU (decode_sum_encode's kernel)."""

    def native(wire):
        return _native(abi.CODEC_DECODE_SUM_ENCODE_WIRE_TARGET, jax.ShapeDtypeStruct(wire.shape[:-2] + wire.shape[-1:],
                                                                                     wire.dtype),
                       wire, block_size=fmt.block_size, length=length)

    return lax.platform_dependent(wire, cpu=native,
                                  default=lambda w: jnp_encode_wire(fmt, jnp_decode_sum_wire(fmt, w, length)))


def decode_wire(fmt: Format, wire, length: int, kept: int | None = None):
    """Wire rows (..., N, W) of `length` codes -> float32 (..., kept): the rows' values one after another, the
    first `kept` (all N * length when not given)."""
    kept = wire.shape[-2] * length if kept is None else kept

    def native(wire):
        return _native(abi.CODEC_DECODE_WIRE_TARGET, jax.ShapeDtypeStruct(wire.shape[:-2] + (kept,), jnp.float32),
                       wire, block_size=fmt.block_size, length=length)

    return lax.platform_dependent(wire, cpu=native, default=lambda w: jnp_decode_wire(fmt, w, length, kept))


def jnp_encode_wire(fmt: Format, x):
    """encode_wire as jax.numpy (the default platforms' definition; XLA:GPU fuses the concatenation)."""
    codes, scales = fmt.encode(x)
    pad = [(0, 0)] * (x.ndim - 1) + [(0, _wire_scales_at(x.shape[-1]) - x.shape[-1])]
    scale_bytes = lax.bitcast_convert_type(scales, fmt.code_dtype).reshape(scales.shape[:-1] + (-1,))
    return jnp.concatenate([jnp.pad(codes, pad), scale_bytes], axis=-1)


def _jnp_split_wire(wire, length: int):
    at = _wire_scales_at(length)
    return wire[..., :length], lax.bitcast_convert_type(wire[..., at:].reshape(wire.shape[:-1] + (-1, 4)),
                                                         jnp.float32)


def jnp_decode_sum_wire(fmt: Format, wire, length: int):
    """decode_sum_wire as jax.numpy."""
    return _jnp_decode_sum(fmt, *_jnp_split_wire(wire, length))


def jnp_decode_wire(fmt: Format, wire, length: int, kept: int):
    """decode_wire as jax.numpy."""
    decoded = fmt.decode(*_jnp_split_wire(wire, length))
    return decoded.reshape(decoded.shape[:-2] + (-1,))[..., :kept]


def roundtrip(fmt: Format, x):
    """x (float32, last axis whole blocks) after fmt's encode and decode: formats.roundtrip, through the native
    codec on CPU for the block formats (Bf16 is a conversion XLA runs as fast)."""
    if isinstance(fmt, Bf16):
        return jnp_roundtrip(x, fmt)
    return decode(fmt, *encode(fmt, x))
