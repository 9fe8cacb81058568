// The instantiations of the executor kernel, one per element type and reduction, split over two translation
// units (kernels_float.cu, kernels_int.cu) so that a 2-core build compiles them in parallel.
#pragma once

#include "csrc/abi.hpp"
#include "csrc/dtype.hpp"

namespace jaxcoll::cuda {

// &plan_kernel<T, R> for the type and reduction, or nullptr when that translation unit does not hold it.
// bool is run as uint8 with sum meaning max (logical or), as the CPU executor does.
const void* float_plan_kernel(DType dtype, ReduceOp op);
const void* int_plan_kernel(DType dtype, ReduceOp op);

inline const void* plan_kernel_for(DType dtype, ReduceOp op) {
  if (dtype == DType::kBool) return int_plan_kernel(DType::kU8, op == ReduceOp::kSum ? ReduceOp::kMax : op);
  if (const void* k = float_plan_kernel(dtype, op)) return k;
  return int_plan_kernel(dtype, op);
}

}  // namespace jaxcoll::cuda
