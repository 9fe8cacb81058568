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

const void* float_plan_kernel(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF16: return by_op<Half>(op);
    case DType::kBF16: return by_op<BFloat16>(op);
    case DType::kF32: return by_op<Plain<float>>(op);
    case DType::kF64: return by_op<Plain<double>>(op);
    default: return nullptr;
  }
}

}  // namespace jaxcoll::cuda
