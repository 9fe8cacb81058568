#include "csrc/cuda/kernel.cuh"
#include "csrc/cuda/kernels.hpp"

namespace jaxcoll::cuda {

const void* int_plan_kernel(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kI8: return plan_kernel_by_op<Plain<int8_t>>(op);
    case DType::kI32: return plan_kernel_by_op<Plain<int32_t>>(op);
    case DType::kI64: return plan_kernel_by_op<Plain<int64_t>>(op);
    case DType::kU8: return plan_kernel_by_op<Plain<uint8_t>>(op);
    case DType::kU32: return plan_kernel_by_op<Plain<uint32_t>>(op);
    default: return nullptr;
  }
}

}  // namespace jaxcoll::cuda
