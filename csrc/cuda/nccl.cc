#include "csrc/cuda/nccl.hpp"

#include <dlfcn.h>

#include <mutex>
#include <optional>
#include <string>

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

struct Nccl {
  AllReduceFn all_reduce = nullptr;
  ReduceScatterFn reduce_scatter = nullptr;
  AllGatherFn all_gather = nullptr;
  ErrorStringFn error_string = nullptr;
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
    if (!n.all_reduce || !n.reduce_scatter || !n.all_gather)
      n.missing = "the loaded libnccl lacks ncclAllReduce, ncclReduceScatter or ncclAllGather";
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

}  // namespace

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
  if (rc != 0)
    return Status::Error(std::string(call) + " failed: " + (n.error_string ? n.error_string(rc) : "NCCL error") +
                         " (code " + std::to_string(rc) + ")");
  return {};
}

}  // namespace jaxcoll::cuda
