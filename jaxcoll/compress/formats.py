"""The wire formats of compressed collectives: how a float32 vector is encoded into fewer bytes, decoded back,
and how far the decoded value may be from the original.

A format encodes the last axis of an array. The block formats (`Int8`, `Fp8`) cut it into blocks of
`block_size` consecutive elements and keep one float32 scale per block; `Bf16` rounds each element on its own.
A format encodes to codes (int8, e4m3 bits as uint8, bfloat16) and float32 scales; on the wire the quantized
collectives move both in one array per row, which the codec writes and reads in place (jaxcoll.compress.codec,
`encode_wire`).

Per-element error bounds (x an element, x' its decoded value, a the largest |x| of its block, s the block's
scale, every input finite):
  Int8:  s = a/127, codes round(x/s) in [-127, 127]:  |x - x'| <= (s/2) (1 + 2^-15)
  Fp8:   s = a/448, codes x/s rounded to e4m3 (4 exponent bits, 3 mantissa bits, largest 448, no infinities):
         |x - x'| <= max(2^-4 |x|, 2^-10 s) (1 + 2^-15)   (2^-4: half a unit of the 3-bit mantissa;
         2^-10 s: half the spacing of e4m3's subnormals)
  Bf16:  round to nearest even with an 8-bit mantissa:  |x - x'| <= 2^-8 |x|
Subnormal float32 inputs: XLA:CPU flushes them to zero before any arithmetic, so they read as 0 (error below
2^-126); a block whose scale would be subnormal (a < 127 * 2^-126 for Int8, 448 * 2^-126 for Fp8) encodes as
zeros, error at most a < 2^-117.
Non-finite inputs: a block holding an inf or a NaN decodes to NaN in every element (its scale is NaN), so a sum
that includes it is NaN where the block was and overflow is never hidden; Bf16 keeps inf and NaN as they are.
The (1 + 2^-15) covers the float32 rounding of 1/s, x * (1/s) and codes * s.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_F32_TINY = np.float32(np.finfo(np.float32).tiny)  # 2^-126, the smallest normal float32


@dataclasses.dataclass(frozen=True)
class Format:
    """A wire format; the subclasses are the formats. `name` is the string `compression=` accepts."""

    name = ""
    block_size = 1

    def wire_bytes(self, n: int) -> int:
        """Bytes on the wire for `n` elements (codes and scales)."""
        raise NotImplementedError

    def encode(self, x):
        """(codes, scales) of float32 `x`, encoded along its last axis, in dtypes the runtime moves."""
        raise NotImplementedError

    def decode(self, codes, scales):
        """float32 values of (codes, scales)."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Bf16(Format):
    """bfloat16 codes, no scale: 2 bytes an element, error <= 2^-8 |x|."""

    name = "bf16"
    block_size = 1

    def wire_bytes(self, n: int) -> int:
        return 2 * n

    def encode(self, x):
        return x.astype(jnp.bfloat16), None

    def decode(self, codes, scales):
        del scales
        return codes.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class _Blocked(Format):
    """A format with one float32 scale per block of `block_size` elements, s = absmax / code_max; a subclass
    says how a scaled value in [-code_max, code_max] becomes a code (`round`) and back (`values`)."""

    block_size: int = 256
    code_max = 1.0
    code_dtype = None  # the dtype of the codes on the wire

    def __post_init__(self):
        b = self.block_size
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ValueError(f"{type(self).__name__}: block_size={b!r} must be a positive integer")

    def wire_bytes(self, n: int) -> int:
        return n + 4 * (n // self.block_size)

    def scale(self, x):
        """The blocks of x (..., n/B, B) and their scales (..., n/B, 1): NaN for a block with a non-finite
        element, 0 for a block too small for a normal scale."""
        blocks = x.reshape(*x.shape[:-1], x.shape[-1] // self.block_size, self.block_size)
        # The largest magnitude as an integer max of the bits without the sign: NaN's bits exceed inf's, which
        # exceed every finite value's, so a NaN or inf always wins. A float max need not propagate NaN: XLA:CPU's
        # vectorized reduction dropped it from blocks of 1000 elements and more (jaxlib 0.10.2).
        top = jnp.max(lax.bitcast_convert_type(blocks, jnp.int32) & 0x7FFFFFFF, axis=-1, keepdims=True)
        absmax = lax.bitcast_convert_type(top, jnp.float32)  # NaN if the block holds one, inf if inf
        s = absmax / np.float32(self.code_max)
        s = jnp.where(s >= _F32_TINY, s, np.float32(0))  # NaN compares false: fixed below
        return blocks, jnp.where(jnp.isfinite(absmax), s, np.float32(np.nan))

    def encode(self, x):
        blocks, s = self.scale(x)
        usable = s > 0  # false for zero and NaN scales: their codes are 0
        # One division per block, a multiply per element (a division per element costs several multiplies).
        inverse = np.float32(1) / jnp.where(usable, s, np.float32(1))
        y = jnp.where(usable, blocks * inverse, np.float32(0))
        codes = self.round(jnp.clip(y, -self.code_max, self.code_max))
        return codes.reshape(x.shape), s[..., 0]

    def decode(self, codes, scales):
        blocks = self.values(codes.reshape(*codes.shape[:-1], -1, self.block_size))
        return (blocks * scales[..., None]).reshape(codes.shape[:-1] + (-1,))


@dataclasses.dataclass(frozen=True)
class Int8(_Blocked):
    """int8 codes with an absmax float32 scale per block: 1 + 4/block_size bytes an element, error <= s/2."""

    name = "int8"
    code_max = 127.0
    code_dtype = jnp.int8

    def round(self, y):
        return jnp.round(y).astype(self.code_dtype)

    def values(self, codes):
        return codes.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class Fp8(_Blocked):
    """float8 e4m3 codes with a float32 scale per block mapping the block's absmax to 448: 1 + 4/block_size
    bytes an element, error <= max(2^-4 |x|, 2^-10 s)."""

    name = "fp8"
    code_max = 448.0
    code_dtype = jnp.uint8

    # The codes are e4m3's bits (float8_e4m3fn: sign, 4 exponent bits of bias 7, 3 mantissa bits), made and read
    # with integer operations on float32's bits: XLA:CPU's conversions to and from float8_e4m3fn ran 3x slower
    # than the whole int8 path here. tests/test_compress_formats.py holds them to ml_dtypes' conversion.
    _REBIAS = (127 - 7) << 3  # float32's exponent bias to e4m3's, in units of e4m3's mantissa

    def round(self, y):
        """e4m3 bits of y (|y| <= 448), rounded to nearest even."""
        bits = lax.bitcast_convert_type(y, jnp.int32)
        sign = (bits >> 24) & 0x80
        magnitude = bits & 0x7FFFFFFF
        # Normal e4m3 (|y| >= 2^-6): keep 3 of float32's 23 mantissa bits, rounding half to even.
        normal = ((magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20) - self._REBIAS
        # Subnormal e4m3: multiples of 2^-9; a round up to 8 is the smallest normal's code, 8.
        subnormal = jnp.round(jnp.abs(y) * np.float32(512)).astype(jnp.int32)
        code = jnp.where(magnitude >= 0x3C800000, normal, subnormal)  # 0x3C800000: 2^-6
        return (code | sign).astype(self.code_dtype)

    def values(self, codes):
        c = codes.astype(jnp.int32)
        magnitude = c & 0x7F
        normal = lax.bitcast_convert_type((magnitude + self._REBIAS) << 20, jnp.float32)
        value = jnp.where(magnitude < 8, magnitude.astype(jnp.float32) * np.float32(2.0 ** -9), normal)
        return jnp.where(c >= 0x80, -value, value)


FORMATS = {"bf16": Bf16, "fp8": Fp8, "int8": Int8}


def parse(api_name: str, compression) -> Format:
    """The Format that `compression=` names: a Format, or "bf16", "fp8", "int8" (block_size 256)."""
    if isinstance(compression, Format):
        return compression
    if isinstance(compression, str) and compression in FORMATS:
        return FORMATS[compression]()
    raise ValueError(f"{api_name}: compression={compression!r} is not a known compression; use one of "
                     f"{', '.join(map(repr, FORMATS))}, a jaxcoll.compress format (Int8(block_size=...), "
                     f"Fp8(...), Bf16()) or jaxcoll.compress.TopK(...)")


def check_operand(api_name: str, fmt: Format, x, elements: int) -> None:
    """TypeError for a non-float operand, ValueError for a block size that does not divide `elements` (the
    number of elements each encoded piece of x holds)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{api_name}: compression={fmt.name!r} is lossy and needs a float operand, got "
                        f"dtype={np.dtype(x.dtype).name}; drop compression= for integer data")
    if elements % fmt.block_size:
        raise ValueError(f"{api_name}: block_size={fmt.block_size} of compression={fmt.name!r} does not divide "
                         f"the {elements} elements of each encoded piece of x (shape {tuple(x.shape)})")


def roundtrip(x, fmt: Format):
    """x (float32, last axis a multiple of the block size) as it reads after fmt's encode and decode."""
    codes, scales = fmt.encode(x)
    return fmt.decode(codes, scales)


@jax.custom_jvp
def _straight_through(x, y):
    del x
    return y


@_straight_through.defjvp
def _straight_through_jvp(primals, tangents):
    x, y = primals
    dx, _ = tangents
    return y, dx


def straight_through(x, y):
    """y, with the derivative of x: a quantizer's straight-through estimator (d y / d x taken as 1)."""
    return _straight_through(x, lax.stop_gradient(y))


def quantize(x, compression="int8"):
    """`x` as it reads after a trip through the wire format `compression` (encode then decode), in x's dtype;
    differentiable with the straight-through estimator. The error of each element is within the bound stated
    in this module's docstring. Encodes the flattened x; block_size must divide x.size."""
    api = "jaxcoll.compress.quantize"
    fmt = parse(api, compression)
    x = jnp.asarray(x)
    check_operand(api, fmt, x, x.size)
    y = roundtrip(x.astype(jnp.float32).reshape(-1), fmt).reshape(x.shape).astype(x.dtype)
    return straight_through(x, y)
