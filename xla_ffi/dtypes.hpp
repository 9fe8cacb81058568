// XLA's element types as the runtime's DType: the one mapping every FFI handler (CPU and CUDA) uses.
#pragma once

#include <optional>

#include "csrc/dtype.hpp"
#include "xla/ffi/api/ffi.h"

namespace jaxcoll {

inline std::optional<DType> dtype_of(xla::ffi::DataType t) {
  using xla::ffi::DataType;
  switch (t) {
    case DataType::F16: return DType::kF16;
    case DataType::BF16: return DType::kBF16;
    case DataType::F32: return DType::kF32;
    case DataType::F64: return DType::kF64;
    case DataType::S8: return DType::kI8;
    case DataType::S32: return DType::kI32;
    case DataType::S64: return DType::kI64;
    case DataType::U8: return DType::kU8;
    case DataType::U32: return DType::kU32;
    case DataType::PRED: return DType::kBool;
    default: return std::nullopt;
  }
}

}  // namespace jaxcoll
