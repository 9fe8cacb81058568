#include "xla_ffi/codec_handlers.hpp"

#include <optional>
#include <string>

#include "csrc/abi.hpp"
#include "csrc/codec.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcoll::xla_cpu {
namespace {

using Dims = ffi::AnyBuffer::Dimensions;

// The codes' element type is the format: int8 codes are Int8's, uint8 codes are Fp8's e4m3 bits.
std::optional<CodeFormat> format_of(ffi::DataType t) {
  if (t == ffi::DataType::S8) return CodeFormat::kInt8;
  if (t == ffi::DataType::U8) return CodeFormat::kFp8;
  return std::nullopt;
}

std::string shape(Dims d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

int64_t product(Dims d, size_t count) {
  int64_t p = 1;
  for (size_t i = 0; i < count; ++i) p *= d[i];
  return p;
}

bool same_leading(Dims a, Dims b, size_t count) {
  if (a.size() < count || b.size() < count) return false;
  for (size_t i = 0; i < count; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

ffi::Error invalid(const char* target, const std::string& what) {
  return ffi::Error::InvalidArgument(std::string(target) + ": " + what);
}

// The checks every handler shares: a known code type, a positive block size, and `length` a whole number of
// blocks. Returns the format, or sets `error`.
std::optional<CodeFormat> check_codes(const char* target, ffi::DataType codes_type, int64_t block, int64_t length,
                                      ffi::Error& error) {
  const auto format = format_of(codes_type);
  if (!format) {
    error = invalid(target, "codes must be int8 (Int8) or uint8 (Fp8's e4m3 bits), got element type " +
                                std::to_string(static_cast<int>(codes_type)));
    return std::nullopt;
  }
  if (block < 1 || length % block) {
    error = invalid(target, "block_size=" + std::to_string(block) + " must be positive and divide the codes' last "
                            "axis of " + std::to_string(length) + " elements");
    return std::nullopt;
  }
  return format;
}

ffi::Error Encode(ffi::Buffer<ffi::F32> x, ffi::Result<ffi::AnyBuffer> codes, ffi::Result<ffi::Buffer<ffi::F32>> scales,
                  int64_t block) {
  const char* target = kCodecEncodeTarget;
  const Dims xd = x.dimensions(), cd = codes->dimensions(), sd = scales->dimensions();
  if (xd.size() == 0 || cd.size() != xd.size() || sd.size() != xd.size() || !same_leading(xd, cd, xd.size() - 1) ||
      !same_leading(xd, sd, xd.size() - 1))
    return invalid(target, "x " + shape(xd) + ", codes " + shape(cd) + " and scales " + shape(sd) +
                               " must have one rank >= 1 and the same leading axes");
  const int64_t length = xd.back(), padded = cd.back();
  ffi::Error error = ffi::Error::Success();
  const auto format = check_codes(target, codes->element_type(), block, padded, error);
  if (!format) return error;
  if (length % block || length > padded || sd.back() * block != padded)
    return invalid(target, "x " + shape(xd) + " must end in whole blocks of block_size=" + std::to_string(block) +
                               ", no more than the codes " + shape(cd) + ", with one scale per block of codes, got "
                               "scales " + shape(sd));
  if (codes->element_count() == 0) return ffi::Error::Success();
  encode_rows(*format, block, x.typed_data(), product(xd, xd.size() - 1), length, padded, codes->untyped_data(),
              scales->typed_data());
  return ffi::Error::Success();
}

ffi::Error Decode(ffi::AnyBuffer codes, ffi::Buffer<ffi::F32> scales, ffi::Result<ffi::Buffer<ffi::F32>> out,
                  int64_t block) {
  const char* target = kCodecDecodeTarget;
  const Dims cd = codes.dimensions(), sd = scales.dimensions(), od = out->dimensions();
  if (cd.size() == 0 || sd.size() != cd.size() || od.size() != cd.size() || !same_leading(cd, sd, cd.size() - 1) ||
      !same_leading(cd, od, cd.size() - 1))
    return invalid(target, "codes " + shape(cd) + ", scales " + shape(sd) + " and the result " + shape(od) +
                               " must have one rank >= 1 and the same leading axes");
  const int64_t length = cd.back(), kept = od.back();
  ffi::Error error = ffi::Error::Success();
  const auto format = check_codes(target, codes.element_type(), block, length, error);
  if (!format) return error;
  if (sd.back() * block != length || kept > length)
    return invalid(target, "codes " + shape(cd) + " need one scale per block of block_size=" +
                               std::to_string(block) + " (got scales " + shape(sd) + ") and at least the result's " +
                               shape(od) + " elements a row");
  if (out->element_count() == 0) return ffi::Error::Success();
  decode_rows(*format, block, codes.untyped_data(), scales.typed_data(), product(cd, cd.size() - 1), length, kept,
              out->typed_data());
  return ffi::Error::Success();
}

// The operands of decode_sum and decode_sum_encode: codes (..., N, L), scales (..., N, L / block). Returns the
// format and sets batch, terms and length, or sets `error`.
std::optional<CodeFormat> check_rows(const char* target, const ffi::AnyBuffer& codes,
                                     const ffi::Buffer<ffi::F32>& scales, int64_t block, int64_t& batch,
                                     int64_t& terms, int64_t& length, ffi::Error& error) {
  const Dims cd = codes.dimensions(), sd = scales.dimensions();
  if (cd.size() < 2 || sd.size() != cd.size() || !same_leading(cd, sd, cd.size() - 1)) {
    error = invalid(target, "codes " + shape(cd) + " and scales " + shape(sd) +
                                " must have one rank >= 2 (rows to sum, then elements) and the same leading axes");
    return std::nullopt;
  }
  length = cd.back();
  terms = cd[cd.size() - 2];
  batch = product(cd, cd.size() - 2);
  const auto format = check_codes(target, codes.element_type(), block, length, error);
  if (!format) return std::nullopt;
  if (sd.back() * block != length || terms < 1) {
    error = invalid(target, "codes " + shape(cd) + " need at least one row and one scale per block of block_size=" +
                                std::to_string(block) + ", got scales " + shape(sd));
    return std::nullopt;
  }
  return format;
}

bool is_rows_result(Dims codes, Dims result, int64_t last) {
  return result.size() + 1 == codes.size() && same_leading(codes, result, codes.size() - 2) && result.back() == last;
}

ffi::Error DecodeSum(ffi::AnyBuffer codes, ffi::Buffer<ffi::F32> scales, ffi::Result<ffi::Buffer<ffi::F32>> out,
                     int64_t block) {
  const char* target = kCodecDecodeSumTarget;
  int64_t batch = 0, terms = 0, length = 0;
  ffi::Error error = ffi::Error::Success();
  const auto format = check_rows(target, codes, scales, block, batch, terms, length, error);
  if (!format) return error;
  if (!is_rows_result(codes.dimensions(), out->dimensions(), length))
    return invalid(target, "the result " + shape(out->dimensions()) + " must be the codes " +
                               shape(codes.dimensions()) + " without their row axis");
  if (out->element_count() == 0) return ffi::Error::Success();
  decode_sum_rows(*format, block, codes.untyped_data(), scales.typed_data(), batch, terms, length,
                  out->typed_data());
  return ffi::Error::Success();
}

ffi::Error DecodeSumEncode(ffi::AnyBuffer codes, ffi::Buffer<ffi::F32> scales, ffi::Result<ffi::AnyBuffer> out_codes,
                           ffi::Result<ffi::Buffer<ffi::F32>> out_scales, int64_t block) {
  const char* target = kCodecDecodeSumEncodeTarget;
  int64_t batch = 0, terms = 0, length = 0;
  ffi::Error error = ffi::Error::Success();
  const auto format = check_rows(target, codes, scales, block, batch, terms, length, error);
  if (!format) return error;
  if (out_codes->element_type() != codes.element_type() ||
      !is_rows_result(codes.dimensions(), out_codes->dimensions(), length) ||
      !is_rows_result(scales.dimensions(), out_scales->dimensions(), length / block))
    return invalid(target, "the results " + shape(out_codes->dimensions()) + " and " +
                               shape(out_scales->dimensions()) + " must be the codes " + shape(codes.dimensions()) +
                               " and scales " + shape(scales.dimensions()) + " without their row axis, codes of "
                               "the same type");
  if (out_codes->element_count() == 0) return ffi::Error::Success();
  decode_sum_encode_rows(*format, block, codes.untyped_data(), scales.typed_data(), batch, terms, length,
                         out_codes->untyped_data(), out_scales->typed_data());
  return ffi::Error::Success();
}

// The wire form (csrc/codec.hpp): x (..., L) -> wire rows (..., wire_row_bytes(L)).
ffi::Error EncodeWire(ffi::Buffer<ffi::F32> x, ffi::Result<ffi::AnyBuffer> wire, int64_t block) {
  const char* target = kCodecEncodeWireTarget;
  const Dims xd = x.dimensions(), wd = wire->dimensions();
  if (xd.size() == 0 || wd.size() != xd.size() || !same_leading(xd, wd, xd.size() - 1))
    return invalid(target, "x " + shape(xd) + " and the wire rows " + shape(wd) +
                               " must have one rank >= 1 and the same leading axes");
  const int64_t length = xd.back();
  ffi::Error error = ffi::Error::Success();
  const auto format = check_codes(target, wire->element_type(), block, length, error);
  if (!format) return error;
  if (wd.back() != wire_row_bytes(length, block))
    return invalid(target, "wire rows of " + std::to_string(length) + " codes in blocks of block_size=" +
                               std::to_string(block) + " hold " + std::to_string(wire_row_bytes(length, block)) +
                               " bytes, got " + shape(wd));
  if (x.element_count() == 0) return ffi::Error::Success();
  encode_wire_rows(*format, block, x.typed_data(), product(xd, xd.size() - 1), length, wire->untyped_data());
  return ffi::Error::Success();
}

// Wire rows (..., N, W) -> float32 (..., L): the N decoded rows summed in order, as DecodeSum.
ffi::Error DecodeSumWire(ffi::AnyBuffer wire, ffi::Result<ffi::Buffer<ffi::F32>> out, int64_t block) {
  const char* target = kCodecDecodeSumWireTarget;
  const Dims wd = wire.dimensions(), od = out->dimensions();
  if (wd.size() < 2 || od.size() + 1 != wd.size() || !same_leading(wd, od, wd.size() - 2) || wd[wd.size() - 2] < 1)
    return invalid(target, "the wire rows " + shape(wd) + " must have one rank >= 2 (at least one row to sum, then "
                               "bytes) and the result " + shape(od) + " their leading axes");
  const int64_t length = od.back();
  ffi::Error error = ffi::Error::Success();
  const auto format = check_codes(target, wire.element_type(), block, length, error);
  if (!format) return error;
  if (wd.back() != wire_row_bytes(length, block))
    return invalid(target, "wire rows of " + std::to_string(length) + " codes in blocks of block_size=" +
                               std::to_string(block) + " hold " + std::to_string(wire_row_bytes(length, block)) +
                               " bytes, got " + shape(wd));
  if (out->element_count() == 0) return ffi::Error::Success();
  decode_sum_wire_rows(*format, block, wire.untyped_data(), product(wd, wd.size() - 2), wd[wd.size() - 2], length,
                       out->typed_data());
  return ffi::Error::Success();
}

// The checks of a wire operand (..., N, W) of `length` codes a row: a known code type, whole blocks, W the row's
// bytes. Returns the format, or sets `error`.
std::optional<CodeFormat> check_wire(const char* target, const ffi::AnyBuffer& wire, int64_t block, int64_t length,
                                     ffi::Error& error) {
  const Dims wd = wire.dimensions();
  if (wd.size() < 2 || wd[wd.size() - 2] < 1) {
    error = invalid(target, "the wire rows " + shape(wd) + " must have one rank >= 2 (at least one row, then bytes)");
    return std::nullopt;
  }
  const auto format = check_codes(target, wire.element_type(), block, length, error);
  if (!format) return std::nullopt;
  if (wd.back() != wire_row_bytes(length, block)) {
    error = invalid(target, "wire rows of " + std::to_string(length) + " codes in blocks of block_size=" +
                                std::to_string(block) + " hold " + std::to_string(wire_row_bytes(length, block)) +
                                " bytes, got " + shape(wd));
    return std::nullopt;
  }
  return format;
}

// Wire rows (..., N, W) -> the encoded sum of each group's N decoded rows, one wire row (..., W).
ffi::Error DecodeSumEncodeWire(ffi::AnyBuffer wire, ffi::Result<ffi::AnyBuffer> out, int64_t block, int64_t length) {
  const char* target = kCodecDecodeSumEncodeWireTarget;
  ffi::Error error = ffi::Error::Success();
  const auto format = check_wire(target, wire, block, length, error);
  if (!format) return error;
  const Dims wd = wire.dimensions(), od = out->dimensions();
  if (out->element_type() != wire.element_type() || !is_rows_result(wd, od, wd.back()))
    return invalid(target, "the result " + shape(od) + " must be the wire rows " + shape(wd) +
                               " without their row axis, of the same type");
  if (out->element_count() == 0) return ffi::Error::Success();
  decode_sum_encode_wire_rows(*format, block, wire.untyped_data(), product(wd, wd.size() - 2), wd[wd.size() - 2],
                              length, out->untyped_data());
  return ffi::Error::Success();
}

// Wire rows (..., N, W) of `length` codes -> float32 (..., K): the rows decoded one after another, the first
// K <= N * length values.
ffi::Error DecodeWire(ffi::AnyBuffer wire, ffi::Result<ffi::Buffer<ffi::F32>> out, int64_t block, int64_t length) {
  const char* target = kCodecDecodeWireTarget;
  ffi::Error error = ffi::Error::Success();
  const auto format = check_wire(target, wire, block, length, error);
  if (!format) return error;
  const Dims wd = wire.dimensions(), od = out->dimensions();
  const int64_t terms = wd[wd.size() - 2];
  if (od.size() + 1 != wd.size() || !same_leading(wd, od, wd.size() - 2) || od.back() > terms * length)
    return invalid(target, "the result " + shape(od) + " must be the wire rows " + shape(wd) + "'s leading axes "
                               "and at most their " + std::to_string(terms * length) + " values");
  if (out->element_count() == 0) return ffi::Error::Success();
  decode_wire_rows(*format, block, wire.untyped_data(), product(wd, wd.size() - 2), terms, length, od.back(),
                   out->typed_data());
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxcoll::xla_cpu

namespace cpu = jaxcoll::xla_cpu;

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcollCodecEncode, cpu::Encode,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block_size"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcollCodecDecode, cpu::Decode,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block_size"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcollCodecDecodeSum, cpu::DecodeSum,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block_size"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcollCodecDecodeSumEncode, cpu::DecodeSumEncode,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block_size"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcollCodecEncodeWire, cpu::EncodeWire,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("block_size"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcollCodecDecodeSumWire, cpu::DecodeSumWire,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block_size"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcollCodecDecodeSumEncodeWire, cpu::DecodeSumEncodeWire,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("length"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcollCodecDecodeWire, cpu::DecodeWire,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("length"));
