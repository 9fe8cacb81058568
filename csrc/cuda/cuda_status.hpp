// A CUDA runtime error as a Status naming the call that failed; for the host files of csrc/cuda/ only (it
// includes the CUDA runtime header, which launcher.hpp keeps out of its users).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "csrc/status.hpp"

namespace jaxcoll::cuda {

inline Status cuda_error(cudaError_t err, const std::string& what) {
  cudaGetLastError();  // clear the error so the next call starts clean (sticky errors stay, as they must)
  return Status::Error("CUDA: " + what + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace jaxcoll::cuda

#define JAXCOLL_CUDA_TRY(expr, what)                                                                          \
  do {                                                                                                       \
    if (cudaError_t jaxcoll_err_ = (expr); jaxcoll_err_ != cudaSuccess)                                      \
      return ::jaxcoll::cuda::cuda_error(jaxcoll_err_, what);                                                \
  } while (0)
