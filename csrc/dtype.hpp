// Element types the executor supports (the reductions are csrc/abi.hpp's ReduceOp). 16-bit floats are reduced in
// float32 (their accumulation type) and rounded once, to nearest even, where a result lands in a buffer of the data
// type; scratch buffers hold the accumulation type (docs/plan-ir.md, "Chunks and sizes"). bool is stored as one
// byte, 0 or 1; its sum is logical or (max), so results stay booleans.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace jaxcoll {

enum class DType : int32_t { kF16, kBF16, kF32, kF64, kI8, kI32, kI64, kU8, kU32, kBool };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kF32: case DType::kI32: case DType::kU32: return 4;
    case DType::kF64: case DType::kI64: return 8;
    case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  return 0;
}

// Bytes of one element of the accumulation type (what scratch holds).
inline size_t accum_size(DType t) {
  return (t == DType::kF16 || t == DType::kBF16) ? 4 : dtype_size(t);
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kI8: return "int8";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
    case DType::kU32: return "uint32";
    case DType::kBool: return "bool";
  }
  return "?";
}

inline std::optional<DType> dtype_from_name(std::string_view name) {
  for (int32_t i = 0; i <= static_cast<int32_t>(DType::kBool); ++i)
    if (name == dtype_name(static_cast<DType>(i))) return static_cast<DType>(i);
  return std::nullopt;
}

}  // namespace jaxcoll
