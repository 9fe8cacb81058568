// The codec of the quantized collectives: the block formats of jaxcoll/compress/formats.py (Int8, Fp8) as native
// kernels, bitwise equal to their jax.numpy definition as XLA:CPU runs it (docs/compression.md, "The codec").
// A block of `block` consecutive float32 elements becomes `block` one-byte codes and one float32 scale
// s = absmax / code_max (0 below 2^-126, NaN for a block holding an inf or a NaN); a code is the element times
// 1/s, clipped to [-code_max, code_max] and rounded half to even (Int8) or to e4m3's bits (Fp8).
//
// Every kernel runs with flush-to-zero and denormals-are-zero, the floating-point mode of XLA:CPU's compiled
// code, so subnormal inputs read as 0 and subnormal results become 0 exactly as in the jax.numpy version.
// A row of codes is `length` bytes; its scales are length / block floats. Buffers must not overlap.
#pragma once

#include <cstdint>

namespace jaxcoll {

// The codes' format; the FFI layer reads it from the codes' element type (int8: kInt8, uint8 e4m3 bits: kFp8).
enum class CodeFormat : int32_t { kInt8, kFp8 };

// `rows` rows of `length` float32 elements (a whole number of blocks) -> rows of `padded` >= length codes and
// padded / block scales; codes and scales past `length` are zero (a zero block's encoding).
void encode_rows(CodeFormat format, int64_t block, const float* x, int64_t rows, int64_t length, int64_t padded,
                 void* codes, float* scales);

// `rows` rows of `length` codes (a whole number of blocks) -> rows of the first `kept` <= length decoded
// float32 values.
void decode_rows(CodeFormat format, int64_t block, const void* codes, const float* scales, int64_t rows,
                 int64_t length, int64_t kept, float* out);

// For each of `batch` groups of `terms` rows of `length` codes: the float32 sum of the decoded rows, in row
// order, in one pass (a tile of the sum stays in L1 while every row streams through it). The sum rounds as
// XLA:CPU's fused loop of `decoded[0] + decoded[1] + ...` does (csrc/codec.cc, `sum_tile`).
void decode_sum_rows(CodeFormat format, int64_t block, const void* codes, const float* scales, int64_t batch,
                     int64_t terms, int64_t length, float* out);

// decode_sum_rows followed by encode_rows of each sum, tile by tile: the sum never goes to memory.
void decode_sum_encode_rows(CodeFormat format, int64_t block, const void* codes, const float* scales,
                            int64_t batch, int64_t terms, int64_t length, void* out_codes, float* out_scales);

// The wire form: codes and scales in one array, so that one collective moves both (one rendezvous across
// processes, not two). A wire row of `length` codes is the codes, zero bytes up to a multiple of 4, then the
// length / block float32 scales; wire_row_bytes is its size, every row starting at a multiple of it.
inline int64_t wire_scales_offset(int64_t length) { return (length + 3) / 4 * 4; }
int64_t wire_row_bytes(int64_t length, int64_t block);

// encode_rows into wire rows (no padding blocks).
void encode_wire_rows(CodeFormat format, int64_t block, const float* x, int64_t rows, int64_t length, void* wire);

// decode_sum_rows from wire rows: `batch` groups of `terms` wire rows of `length` codes -> float32 sums.
void decode_sum_wire_rows(CodeFormat format, int64_t block, const void* wire, int64_t batch, int64_t terms,
                          int64_t length, float* out);

// decode_sum_encode_rows from and to wire rows: each group's sum encoded as one wire row.
void decode_sum_encode_wire_rows(CodeFormat format, int64_t block, const void* wire, int64_t batch, int64_t terms,
                                 int64_t length, void* out_wire);

// `batch` groups of `terms` wire rows of `length` codes -> per group the rows' decoded values one after another,
// the first `kept` <= terms * length of them.
void decode_wire_rows(CodeFormat format, int64_t block, const void* wire, int64_t batch, int64_t terms,
                      int64_t length, int64_t kept, float* out);

}  // namespace jaxcoll
