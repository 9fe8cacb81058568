#include "csrc/cuda/kernel.cuh"
#include "csrc/cuda/kernels.hpp"

namespace jaxcoll::cuda {

const void* float_plan_kernel(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF16: return plan_kernel_by_op<Half>(op);
    case DType::kBF16: return plan_kernel_by_op<BFloat16>(op);
    case DType::kF32: return plan_kernel_by_op<Plain<float>>(op);
    case DType::kF64: return plan_kernel_by_op<Plain<double>>(op);
    default: return nullptr;
  }
}

}  // namespace jaxcoll::cuda
