#include "csrc/cuda/nccl.hpp"

#include <dlfcn.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace jaxcoll::cuda {

namespace {

// nccl.h's values (stable across NCCL 2.x).
enum NcclType : int { kInt8 = 0, kUint8 = 1, kInt32 = 2, kUint32 = 3, kInt64 = 4, kFloat16 = 6,
                      kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9 };
enum NcclOp : int { kSum = 0, kMax = 2, kMin = 3 };
using AllReduceFn = int (*)(const void*, void*, size_t, int, int, void*, CUstream_st*);
using ReduceScatterFn = int (*)(const void*, void*, size_t, int, int, void*, CUstream_st*);
using AllGatherFn = int (*)(const void*, void*, size_t, int, void*, CUstream_st*);
using ErrorStringFn = const char* (*)(int);
using BroadcastFn = int (*)(const void*, void*, size_t, int, int, void*, CUstream_st*);
using SendFn = int (*)(const void*, size_t, int, int, void*, CUstream_st*);
using RecvFn = int (*)(void*, size_t, int, int, void*, CUstream_st*);
using GroupFn = int (*)();
using CommIntFn = int (*)(void*, int*);  // ncclCommUserRank, ncclCommCount

struct Nccl {
  AllReduceFn all_reduce = nullptr;
  ReduceScatterFn reduce_scatter = nullptr;
  AllGatherFn all_gather = nullptr;
  ErrorStringFn error_string = nullptr;
  BroadcastFn broadcast = nullptr;
  SendFn send = nullptr;  // ncclSend, ncclRecv, ncclGroupStart/End: NCCL 2.7 and later
  RecvFn recv = nullptr;
  GroupFn group_start = nullptr;
  GroupFn group_end = nullptr;
  CommIntFn user_rank = nullptr;
  CommIntFn count = nullptr;
  std::string missing;  // why the entry points are not there
};

const Nccl& nccl() {
  static const Nccl n = [] {
    Nccl n;
    void* lib = nullptr;
    for (const char* name : {"libnccl.so.2", "libnccl.so"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD))) break;
    if (!lib) {
      n.missing = "XLA's NCCL library (libnccl.so.2) is not loaded in this process; the network steps drive the "
                  "communicator XLA lends them, with XLA's own NCCL";
      return n;
    }
    n.all_reduce = reinterpret_cast<AllReduceFn>(dlsym(lib, "ncclAllReduce"));
    n.reduce_scatter = reinterpret_cast<ReduceScatterFn>(dlsym(lib, "ncclReduceScatter"));
    n.all_gather = reinterpret_cast<AllGatherFn>(dlsym(lib, "ncclAllGather"));
    n.error_string = reinterpret_cast<ErrorStringFn>(dlsym(lib, "ncclGetErrorString"));
    n.broadcast = reinterpret_cast<BroadcastFn>(dlsym(lib, "ncclBroadcast"));
    n.send = reinterpret_cast<SendFn>(dlsym(lib, "ncclSend"));
    n.recv = reinterpret_cast<RecvFn>(dlsym(lib, "ncclRecv"));
    n.group_start = reinterpret_cast<GroupFn>(dlsym(lib, "ncclGroupStart"));
    n.group_end = reinterpret_cast<GroupFn>(dlsym(lib, "ncclGroupEnd"));
    n.user_rank = reinterpret_cast<CommIntFn>(dlsym(lib, "ncclCommUserRank"));
    n.count = reinterpret_cast<CommIntFn>(dlsym(lib, "ncclCommCount"));
    std::string lacks;
    for (auto [fn, name] : {std::pair<const void*, const char*>{(const void*)n.all_reduce, "ncclAllReduce"},
                            {(const void*)n.reduce_scatter, "ncclReduceScatter"},
                            {(const void*)n.all_gather, "ncclAllGather"},
                            {(const void*)n.broadcast, "ncclBroadcast"},
                            {(const void*)n.send, "ncclSend"},
                            {(const void*)n.recv, "ncclRecv"},
                            {(const void*)n.group_start, "ncclGroupStart"},
                            {(const void*)n.group_end, "ncclGroupEnd"},
                            {(const void*)n.user_rank, "ncclCommUserRank"},
                            {(const void*)n.count, "ncclCommCount"}})
      if (!fn) lacks += (lacks.empty() ? "" : ", ") + std::string(name);
    if (!lacks.empty()) n.missing = "the loaded libnccl lacks " + lacks + " (jaxcoll needs NCCL 2.7 or later)";
    return n;
  }();
  return n;
}

std::optional<int> nccl_type(DType d) {
  switch (d) {
    case DType::kF16: return kFloat16;
    case DType::kBF16: return kBfloat16;
    case DType::kF32: return kFloat32;
    case DType::kF64: return kFloat64;
    case DType::kI8: return kInt8;
    case DType::kI32: return kInt32;
    case DType::kI64: return kInt64;
    case DType::kU8: case DType::kBool: return kUint8;
    case DType::kU32: return kUint32;
    default: return std::nullopt;
  }
}

Status failed(const Nccl& n, const char* call, int rc) {
  return Status::Error(std::string(call) + " failed: " + (n.error_string ? n.error_string(rc) : "NCCL error") +
                       " (code " + std::to_string(rc) + ")");
}

// Runs `enqueue` (NCCL calls returning their codes, the first failure's name in `call`) between ncclGroupStart
// and ncclGroupEnd: the group is always closed, so a failed call leaves no group open on this thread.
template <typename Enqueue>
Status in_group(const Nccl& n, Enqueue enqueue) {
  if (int rc = n.group_start()) return failed(n, "ncclGroupStart", rc);
  const char* call = "";
  const int rc = enqueue(&call);
  if (int end = n.group_end(); rc == 0 && end != 0) return failed(n, "ncclGroupEnd", end);
  return rc ? failed(n, call, rc) : Status{};
}

}  // namespace

Status nccl_rank(void* comm, int* rank, int* size) {
  const Nccl& n = nccl();
  if (!n.missing.empty()) return Status::Error(n.missing);
  if (int rc = n.user_rank(comm, rank)) return failed(n, "ncclCommUserRank", rc);
  if (int rc = n.count(comm, size)) return failed(n, "ncclCommCount", rc);
  return {};
}

Status nccl_broadcast(const void* send, void* recv, size_t bytes, int root, void* comm, CUstream_st* stream) {
  const Nccl& n = nccl();
  if (!n.missing.empty()) return Status::Error(n.missing);
  if (int rc = n.broadcast(send, recv, bytes, kUint8, root, comm, stream)) return failed(n, "ncclBroadcast", rc);
  return {};
}

Status nccl_all_to_all(const void* send, void* recv, size_t block_bytes, int size, void* comm, CUstream_st* stream) {
  const Nccl& n = nccl();
  if (!n.missing.empty()) return Status::Error(n.missing);
  const auto* from = static_cast<const char*>(send);
  auto* to = static_cast<char*>(recv);
  return in_group(n, [&](const char** call) {
    for (int p = 0; p < size; ++p) {
      const size_t at = size_t(p) * block_bytes;
      if (int rc = n.send(from + at, block_bytes, kUint8, p, comm, stream)) {
        *call = "ncclSend";
        return rc;
      }
      if (int rc = n.recv(to + at, block_bytes, kUint8, p, comm, stream)) {
        *call = "ncclRecv";
        return rc;
      }
    }
    return 0;
  });
}

Status nccl_send_recv(const void* send, int to, void* recv, int from, size_t bytes, void* comm, CUstream_st* stream) {
  const Nccl& n = nccl();
  if (!n.missing.empty()) return Status::Error(n.missing);
  if (to < 0 && from < 0) return {};
  return in_group(n, [&](const char** call) {
    int rc = 0;
    if (to >= 0 && (rc = n.send(send, bytes, kUint8, to, comm, stream))) {
      *call = "ncclSend";
      return rc;
    }
    if (from >= 0 && (rc = n.recv(recv, bytes, kUint8, from, comm, stream))) {
      *call = "ncclRecv";
      return rc;
    }
    return 0;
  });
}

Status nccl_collective(NetworkCollective what, const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                       void* comm, CUstream_st* stream) {
  const Nccl& n = nccl();
  if (!n.missing.empty()) return Status::Error(n.missing);
  const auto type = nccl_type(dtype);
  if (!type) return Status::Error(std::string("NCCL has no type for ") + dtype_name(dtype));
  const int red = op == ReduceOp::kMax ? kMax : op == ReduceOp::kMin ? kMin : kSum;
  int rc = 0;
  const char* call = "";
  switch (what) {
    case NetworkCollective::kAllReduce:
      call = "ncclAllReduce";
      rc = n.all_reduce(send, recv, count, *type, red, comm, stream);
      break;
    case NetworkCollective::kReduceScatter:
      call = "ncclReduceScatter";
      rc = n.reduce_scatter(send, recv, count, *type, red, comm, stream);
      break;
    case NetworkCollective::kAllGather:
      call = "ncclAllGather";
      rc = n.all_gather(send, recv, count, *type, comm, stream);
      break;
  }
  if (rc != 0) return failed(n, call, rc);
  return {};
}

}  // namespace jaxcoll::cuda
