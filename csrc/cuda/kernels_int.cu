#include "kernel.cuh"
#include "kernels.hpp"

namespace jaxcoll::cuda {
namespace {
template <class T>
const void* by_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return reinterpret_cast<const void*>(&plan_kernel<T, Sum>);
    case ReduceOp::kMax: return reinterpret_cast<const void*>(&plan_kernel<T, Max>);
    case ReduceOp::kMin: return reinterpret_cast<const void*>(&plan_kernel<T, Min>);
  }
  return nullptr;
}
}  // namespace

const void* int_plan_kernel(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kI8: return by_op<Plain<int8_t>>(op);
    case DType::kI32: return by_op<Plain<int32_t>>(op);
    case DType::kI64: return by_op<Plain<int64_t>>(op);
    case DType::kU8: return by_op<Plain<uint8_t>>(op);
    case DType::kU32: return by_op<Plain<uint32_t>>(op);
    default: return nullptr;
  }
}

}  // namespace jaxcoll::cuda
