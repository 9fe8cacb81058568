// An NVTX range around each call of the CUDA handler, so that Nsight Systems shows every jaxcoll call (its call
// site and rank) on the host thread that enqueued its kernel, beside XLA's own ranges. NVTX v3 is header-only:
// with no profiler attached a range is one predictable branch; under one it is what the tool records.
#pragma once

#include <nvtx3/nvToolsExt.h>

#include <cstdint>
#include <cstdio>

namespace jaxcoll::xla_cuda {

class NvtxRange {
 public:
  NvtxRange(const char* stage, int64_t callsite, int32_t rank) {
    char name[80];  // on the stack: no allocation per call
    std::snprintf(name, sizeof name, "jaxcoll %s, callsite %lld, rank %d", stage, static_cast<long long>(callsite),
                  static_cast<int>(rank));
    nvtxRangePushA(name);
  }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace jaxcoll::xla_cuda
