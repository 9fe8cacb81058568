#include "csrc/codec.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "csrc/clones.hpp"

// This file is compiled with -ffp-contract=off (CMakeLists.txt): the only fused multiply-adds are the explicit
// std::fma calls that reproduce XLA:CPU's (sum_tile), so every result is the same on every instruction set.

namespace jaxcoll {
namespace {

constexpr float kTiny = 0x1p-126f;  // the smallest normal float32: a smaller scale encodes its block as zeros

// (y + 1.5 * 2^23) - 1.5 * 2^23 rounds |y| < 2^22 to an integer, half to even (the default rounding mode): the
// rounding of jnp.round, as two vector adds on every instruction set.
constexpr float kRoundBias = 12582912.0f;
JAXCOLL_INLINE float round_even(float y) { return (y + kRoundBias) - kRoundBias; }

// A format: its code type, the code of a scaled value y in [-kMax, kMax] and the value of a code, as
// formats.py's `round` and `values` compute them.
struct Int8Format {
  using Code = int8_t;
  static constexpr float kMax = 127.0f;
  static JAXCOLL_INLINE Code code(float y) { return static_cast<Code>(static_cast<int32_t>(round_even(y))); }
  static JAXCOLL_INLINE float value(Code c) { return static_cast<float>(c); }
};

// e4m3 (float8_e4m3fn) bits made and read with integer operations on float32's bits, as formats.Fp8 does. Both
// directions choose between two candidates with a bit mask, not a branch, so the loops vectorize.
struct Fp8Format {
  using Code = uint8_t;
  static constexpr float kMax = 448.0f;
  static constexpr int32_t kRebias = (127 - 7) << 3;  // float32's exponent bias to e4m3's, in e4m3 mantissa units
  static JAXCOLL_INLINE int32_t select(int32_t mask, int32_t a, int32_t b) { return (a & mask) | (b & ~mask); }
  static JAXCOLL_INLINE Code code(float y) {
    const int32_t bits = std::bit_cast<int32_t>(y);
    const int32_t sign = (bits >> 24) & 0x80;
    const int32_t magnitude = bits & 0x7fffffff;
    // Normal e4m3 (|y| >= 2^-6): keep 3 of the 23 mantissa bits, half to even; subnormal: multiples of 2^-9.
    const int32_t normal = ((magnitude + 0x7ffff + ((magnitude >> 20) & 1)) >> 20) - kRebias;
    const int32_t subnormal = static_cast<int32_t>(round_even(std::bit_cast<float>(magnitude) * 512.0f));
    return static_cast<Code>(select(-int32_t(magnitude >= 0x3c800000), normal, subnormal) | sign);
  }
  static JAXCOLL_INLINE float value(Code c) {
    const int32_t magnitude = c & 0x7f;
    const int32_t normal = (magnitude + kRebias) << 20;
    const int32_t subnormal = std::bit_cast<int32_t>(static_cast<float>(magnitude) * 0x1p-9f);
    // The sign bit set on a non-negative value is formats.py's negation (-0 included).
    return std::bit_cast<float>(select(-int32_t(magnitude < 8), subnormal, normal) | ((c & 0x80) << 24));
  }
};

// The block's scale: NaN if it holds an inf or a NaN, else absmax / kMax, 0 below kTiny. The largest magnitude
// is an integer max of float32's bits without the sign (NaN > inf > every finite value, as their bits order);
// XLA:CPU divides by the constant as a multiply by its float32 reciprocal, so this does too.
template <class F>
JAXCOLL_INLINE float block_scale(const float* __restrict x, int64_t n) {
  uint32_t top = 0;
  for (int64_t i = 0; i < n; ++i) top = std::max(top, std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu);
  if (top >= 0x7f800000u) return std::numeric_limits<float>::quiet_NaN();
  const float s = std::bit_cast<float>(top) * (1.0f / F::kMax);
  return s >= kTiny ? s : 0.0f;
}

template <class F>
JAXCOLL_INLINE void encode_block(const float* __restrict x, int64_t n, typename F::Code* __restrict codes,
                                 float* __restrict scale) {
  const float s = block_scale<F>(x, n);
  *scale = s;
  if (!(s > 0)) {  // a zero or NaN scale: every code 0 (0 is the code of +0 in both formats)
    std::memset(codes, 0, size_t(n));
    return;
  }
  const float inverse = 1.0f / s;  // one division per block, a multiply per element, as formats.py
  for (int64_t i = 0; i < n; ++i) {
    float y = x[i] * inverse;
    y = y < -F::kMax ? -F::kMax : y;  // jnp.clip; y is never NaN here
    y = y > F::kMax ? F::kMax : y;
    codes[i] = F::code(y);
  }
}

template <class F>
JAXCOLL_INLINE void decode_block(const typename F::Code* __restrict codes, float s, int64_t n,
                                 float* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = F::value(codes[i]) * s;
}

// The elements of a tile: whole blocks, about 8 KiB of float32, so a partial sum stays in L1.
int64_t tile_elements(int64_t block) { return block * std::max<int64_t>(1, 2048 / block); }

// acc[0, len) = the sum over `terms` rows of decoded elements [t0, t0 + len) (whole blocks), rows
// `code_stride` codes and `scale_stride` scales apart. XLA:CPU fuses formats.py's `decoded[0] + decoded[1] + ...`
// into one loop in which LLVM contracts each add with the product feeding its first operand:
// acc = fma(v0, s0, v1 s1), then acc = fma(vr, sr, acc).
// The same operations here give the same bits (tests/test_compress_codec.py holds them to the jax.numpy sum).
template <class F>
JAXCOLL_INLINE void sum_tile(const typename F::Code* __restrict codes, const float* __restrict scales,
                             int64_t terms, int64_t code_stride, int64_t scale_stride, int64_t block, int64_t t0,
                             int64_t len, float* __restrict acc) {
  using Code = typename F::Code;
  const int64_t b0 = t0 / block, nb = len / block;
  if (terms == 1) {
    for (int64_t b = 0; b < nb; ++b) decode_block<F>(codes + t0 + b * block, scales[b0 + b], block, acc + b * block);
    return;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const Code* __restrict c0 = codes + t0 + b * block;
    const Code* __restrict c1 = c0 + code_stride;
    const float s0 = scales[b0 + b], s1 = scales[scale_stride + b0 + b];
    float* __restrict a = acc + b * block;
    for (int64_t i = 0; i < block; ++i) a[i] = std::fma(F::value(c0[i]), s0, F::value(c1[i]) * s1);
  }
  for (int64_t r = 2; r < terms; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const Code* __restrict c = codes + r * code_stride + t0 + b * block;
      const float s = scales[r * scale_stride + b0 + b];
      float* __restrict a = acc + b * block;
      for (int64_t i = 0; i < block; ++i) a[i] = std::fma(F::value(c[i]), s, a[i]);
    }
  }
}

template <class F>
JAXCOLL_INLINE void encode_typed(int64_t block, const float* x, int64_t rows, int64_t length, int64_t padded,
                                 void* codes_out, float* scales, int64_t code_stride, int64_t scale_stride) {
  using Code = typename F::Code;
  Code* codes = static_cast<Code*>(codes_out);
  const int64_t blocks = length / block, padded_blocks = padded / block;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * length;
    Code* cr = codes + r * code_stride;
    float* sr = scales + r * scale_stride;
    for (int64_t b = 0; b < blocks; ++b) encode_block<F>(xr + b * block, block, cr + b * block, sr + b);
    std::memset(cr + length, 0, size_t(padded - length));
    std::fill(sr + blocks, sr + padded_blocks, 0.0f);
  }
}

// `batch` groups of `terms` rows (`code_stride` codes, `scale_stride` scales apart) of `length` codes -> per
// group the rows' decoded values one after another, the first `kept` <= terms * length of them.
template <class F>
JAXCOLL_INLINE void decode_concat_typed(int64_t block, const void* codes_in, const float* scales, int64_t batch,
                                        int64_t terms, int64_t length, int64_t code_stride, int64_t scale_stride,
                                        int64_t kept, float* out) {
  using Code = typename F::Code;
  const Code* codes = static_cast<const Code*>(codes_in);
  for (int64_t g = 0; g < batch; ++g)
    for (int64_t r = 0; r < terms && r * length < kept; ++r) {
      const int64_t row = g * terms + r, n = std::min(length, kept - r * length);
      const Code* cr = codes + row * code_stride;
      const float* sr = scales + row * scale_stride;
      float* outr = out + g * kept + r * length;
      for (int64_t start = 0, b = 0; start < n; start += block, ++b)
        decode_block<F>(cr + start, sr[b], std::min(block, n - start), outr + start);
    }
}

// The sums go to `out` (float32, `length` a group) or, encoded, to out_codes and out_scales, `out_code_stride`
// codes and `out_scale_stride` scales a group.
template <class F>
JAXCOLL_INLINE void decode_sum_typed(int64_t block, const void* codes_in, const float* scales, int64_t batch,
                                     int64_t terms, int64_t length, int64_t code_stride, int64_t scale_stride,
                                     float* out, void* out_codes_raw, float* out_scales, int64_t out_code_stride,
                                     int64_t out_scale_stride) {
  using Code = typename F::Code;
  const Code* codes = static_cast<const Code*>(codes_in);
  Code* out_codes = static_cast<Code*>(out_codes_raw);
  const int64_t tile = tile_elements(block);
  std::vector<float> scratch(out ? 0 : size_t(tile));
  for (int64_t g = 0; g < batch; ++g) {
    const Code* cg = codes + g * terms * code_stride;
    const float* sg = scales + g * terms * scale_stride;
    for (int64_t t0 = 0; t0 < length; t0 += tile) {
      const int64_t len = std::min(tile, length - t0);
      float* acc = out ? out + g * length + t0 : scratch.data();
      sum_tile<F>(cg, sg, terms, code_stride, scale_stride, block, t0, len, acc);
      if (!out)
        for (int64_t b = 0; b < len / block; ++b)
          encode_block<F>(acc + b * block, block, out_codes + g * out_code_stride + t0 + b * block,
                          out_scales + g * out_scale_stride + t0 / block + b);
    }
  }
}

// One clone set per format and operation; each public function below picks the format.
#define JAXCOLL_DEFINE_CODEC(SUFFIX, FORMAT)                                                                     \
  JAXCOLL_CLONES void encode_##SUFFIX(int64_t block, const float* x, int64_t rows, int64_t length,              \
                                      int64_t padded, void* codes, float* scales, int64_t code_stride,          \
                                      int64_t scale_stride) {                                                   \
    encode_typed<FORMAT>(block, x, rows, length, padded, codes, scales, code_stride, scale_stride);              \
  }                                                                                                              \
  JAXCOLL_CLONES void decode_concat_##SUFFIX(int64_t block, const void* codes, const float* scales,             \
                                             int64_t batch, int64_t terms, int64_t length, int64_t code_stride, \
                                             int64_t scale_stride, int64_t kept, float* out) {                  \
    decode_concat_typed<FORMAT>(block, codes, scales, batch, terms, length, code_stride, scale_stride, kept,    \
                                out);                                                                           \
  }                                                                                                              \
  JAXCOLL_CLONES void decode_sum_##SUFFIX(int64_t block, const void* codes, const float* scales, int64_t batch, \
                                          int64_t terms, int64_t length, int64_t code_stride,                   \
                                          int64_t scale_stride, float* out, void* out_codes, float* out_scales, \
                                          int64_t out_code_stride, int64_t out_scale_stride) {                  \
    decode_sum_typed<FORMAT>(block, codes, scales, batch, terms, length, code_stride, scale_stride, out,        \
                             out_codes, out_scales, out_code_stride, out_scale_stride);                         \
  }

JAXCOLL_DEFINE_CODEC(int8, Int8Format)
JAXCOLL_DEFINE_CODEC(fp8, Fp8Format)

// XLA:CPU runs its compiled code with flush-to-zero and denormals-are-zero set (tsl's ScopedFlushDenormal); the
// kernels set them too for the length of a call, whatever thread calls them, so they round as the jax.numpy
// formats do.
class FlushDenormals {
 public:
  FlushDenormals() {
#if defined(__x86_64__)
    saved_ = _mm_getcsr();
    _mm_setcsr(static_cast<unsigned>(saved_) | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
#elif defined(__aarch64__)
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved_));
    __asm__ volatile("msr fpcr, %0" : : "r"(saved_ | (uint64_t{1} << 24)));  // FZ
#endif
  }
  ~FlushDenormals() {
#if defined(__x86_64__)
    _mm_setcsr(static_cast<unsigned>(saved_));
#elif defined(__aarch64__)
    __asm__ volatile("msr fpcr, %0" : : "r"(saved_));
#endif
  }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  uint64_t saved_ = 0;
};

}  // namespace

void encode_rows(CodeFormat format, int64_t block, const float* x, int64_t rows, int64_t length, int64_t padded,
                 void* codes, float* scales) {
  FlushDenormals mode;
  if (format == CodeFormat::kInt8)
    encode_int8(block, x, rows, length, padded, codes, scales, padded, padded / block);
  else
    encode_fp8(block, x, rows, length, padded, codes, scales, padded, padded / block);
}

void decode_rows(CodeFormat format, int64_t block, const void* codes, const float* scales, int64_t rows,
                 int64_t length, int64_t kept, float* out) {
  FlushDenormals mode;
  if (format == CodeFormat::kInt8)
    decode_concat_int8(block, codes, scales, rows, 1, length, length, length / block, kept, out);
  else
    decode_concat_fp8(block, codes, scales, rows, 1, length, length, length / block, kept, out);
}

void decode_sum_rows(CodeFormat format, int64_t block, const void* codes, const float* scales, int64_t batch,
                     int64_t terms, int64_t length, float* out) {
  FlushDenormals mode;
  if (format == CodeFormat::kInt8)
    decode_sum_int8(block, codes, scales, batch, terms, length, length, length / block, out, nullptr, nullptr, 0, 0);
  else
    decode_sum_fp8(block, codes, scales, batch, terms, length, length, length / block, out, nullptr, nullptr, 0, 0);
}

void decode_sum_encode_rows(CodeFormat format, int64_t block, const void* codes, const float* scales,
                            int64_t batch, int64_t terms, int64_t length, void* out_codes, float* out_scales) {
  FlushDenormals mode;
  if (format == CodeFormat::kInt8)
    decode_sum_int8(block, codes, scales, batch, terms, length, length, length / block, nullptr, out_codes,
                    out_scales, length, length / block);
  else
    decode_sum_fp8(block, codes, scales, batch, terms, length, length, length / block, nullptr, out_codes,
                   out_scales, length, length / block);
}

int64_t wire_row_bytes(int64_t length, int64_t block) { return wire_scales_offset(length) + 4 * (length / block); }

void encode_wire_rows(CodeFormat format, int64_t block, const float* x, int64_t rows, int64_t length, void* wire) {
  FlushDenormals mode;
  const int64_t row = wire_row_bytes(length, block), at = wire_scales_offset(length);
  char* bytes = static_cast<char*>(wire);
  float* scales = reinterpret_cast<float*>(bytes + at);
  if (format == CodeFormat::kInt8)
    encode_int8(block, x, rows, length, length, wire, scales, row, row / 4);
  else
    encode_fp8(block, x, rows, length, length, wire, scales, row, row / 4);
  for (int64_t r = 0; r < rows; ++r) std::memset(bytes + r * row + length, 0, size_t(at - length));
}

void decode_sum_wire_rows(CodeFormat format, int64_t block, const void* wire, int64_t batch, int64_t terms,
                          int64_t length, float* out) {
  FlushDenormals mode;
  const int64_t row = wire_row_bytes(length, block);
  const float* scales = reinterpret_cast<const float*>(static_cast<const char*>(wire) + wire_scales_offset(length));
  if (format == CodeFormat::kInt8)
    decode_sum_int8(block, wire, scales, batch, terms, length, row, row / 4, out, nullptr, nullptr, 0, 0);
  else
    decode_sum_fp8(block, wire, scales, batch, terms, length, row, row / 4, out, nullptr, nullptr, 0, 0);
}

void decode_sum_encode_wire_rows(CodeFormat format, int64_t block, const void* wire, int64_t batch, int64_t terms,
                                 int64_t length, void* out_wire) {
  FlushDenormals mode;
  const int64_t row = wire_row_bytes(length, block), at = wire_scales_offset(length);
  const float* scales = reinterpret_cast<const float*>(static_cast<const char*>(wire) + at);
  char* out = static_cast<char*>(out_wire);
  float* out_scales = reinterpret_cast<float*>(out + at);
  if (format == CodeFormat::kInt8)
    decode_sum_int8(block, wire, scales, batch, terms, length, row, row / 4, nullptr, out, out_scales, row, row / 4);
  else
    decode_sum_fp8(block, wire, scales, batch, terms, length, row, row / 4, nullptr, out, out_scales, row, row / 4);
  for (int64_t g = 0; g < batch; ++g) std::memset(out + g * row + length, 0, size_t(at - length));
}

void decode_wire_rows(CodeFormat format, int64_t block, const void* wire, int64_t batch, int64_t terms,
                      int64_t length, int64_t kept, float* out) {
  FlushDenormals mode;
  const int64_t row = wire_row_bytes(length, block);
  const float* scales = reinterpret_cast<const float*>(static_cast<const char*>(wire) + wire_scales_offset(length));
  if (format == CodeFormat::kInt8)
    decode_concat_int8(block, wire, scales, batch, terms, length, row, row / 4, kept, out);
  else
    decode_concat_fp8(block, wire, scales, batch, terms, length, row, row / 4, kept, out);
}

}  // namespace jaxcoll
