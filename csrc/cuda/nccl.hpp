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
// where XLA's NCCL is not loaded, and NCCL's own message where it fails (so do the functions below).
Status nccl_collective(NetworkCollective what, const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                       void* comm, CUstream_st* stream);

// This rank's position in `comm` and the number of its ranks (ncclCommUserRank, ncclCommCount).
Status nccl_rank(void* comm, int* rank, int* size);

// The collectives that move bytes without reducing them take byte counts (NCCL sees them as uint8, so every dtype
// travels, 16-bit integers included).

// ncclBroadcast of `bytes` from rank `root` of `comm`: every rank's `recv` gets the root's `send`.
Status nccl_broadcast(const void* send, void* recv, size_t bytes, int root, void* comm, CUstream_st* stream);

// all_to_all over the `size` ranks of `comm`, one NCCL group of sends and receives: block p (`block_bytes` at
// p * block_bytes) of `send` goes to rank p, and block p of `recv` comes from rank p.
Status nccl_all_to_all(const void* send, void* recv, size_t block_bytes, int size, void* comm, CUstream_st* stream);

// One NCCL group of at most one send (`send` to rank `to`) and one receive (`recv` from rank `from`), either
// left out where its rank is negative: this rank's part of a permutation.
Status nccl_send_recv(const void* send, int to, void* recv, int from, size_t bytes, void* comm, CUstream_st* stream);

}  // namespace jaxcoll::cuda
