// XLA's NCCL, for the network steps of collectives across GPU hosts (docs/cuda.md, "Across hosts"). The
// communicator comes from XLA (the FFI collectives extension lends it to a handler as an opaque pointer, an
// ncclComm_t on XLA:GPU), so it must be driven by the very library that made it: this finds the libnccl that XLA
// already loaded in the process (dlopen with RTLD_NOLOAD) and never loads a second copy; jaxcoll neither links
// NCCL nor needs its headers. The declarations are NCCL's stable C ABI (nccl.h, 2.x).
#pragma once

#include <cstddef>
#include <cstdint>

#include "csrc/abi.hpp"
#include "csrc/dtype.hpp"
#include "csrc/status.hpp"

struct CUstream_st;

namespace jaxcoll::cuda {

enum class NetworkCollective : int32_t { kAllReduce, kReduceScatter, kAllGather };

// One NCCL collective of `count` elements per rank (the output's for all_reduce, the received block's for
// reduce_scatter, the sent block's for all_gather) on `comm`, enqueued on `stream`. Fails naming what is missing
// where XLA's NCCL is not loaded, and NCCL's own message where it fails.
Status nccl_collective(NetworkCollective what, const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                       void* comm, CUstream_st* stream);

}  // namespace jaxcoll::cuda
