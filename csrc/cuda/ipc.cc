#include "csrc/cuda/ipc.hpp"

#include "csrc/cuda/cuda_status.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <utility>

namespace jaxcoll::cuda {

static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(IpcHandle), "cudaIpcMemHandle_t is 64 bytes");

Status export_ipc_handle(const DeviceMemory& memory, IpcHandle& out) {
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(memory.device());
  cudaIpcMemHandle_t h;
  const cudaError_t err = cudaIpcGetMemHandle(&h, memory.get());
  cudaSetDevice(previous);
  if (err != cudaSuccess) return cuda_error(err, "cudaIpcGetMemHandle");
  std::memcpy(out.data(), &h, sizeof(h));
  return {};
}

PeerMapping& PeerMapping::operator=(PeerMapping&& o) noexcept {
  if (this != &o) {
    this->~PeerMapping();
    ptr_ = std::exchange(o.ptr_, nullptr);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

PeerMapping::~PeerMapping() {
  if (!ptr_) return;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  cudaIpcCloseMemHandle(ptr_);
  cudaSetDevice(previous);
  ptr_ = nullptr;
}

Status PeerMapping::open(const IpcHandle& handle, int device, PeerMapping& out) {
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  void* p = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  cudaSetDevice(previous);
  if (err != cudaSuccess) return cuda_error(err, "cudaIpcOpenMemHandle");
  PeerMapping m;
  m.ptr_ = static_cast<char*>(p);
  m.device_ = device;
  out = std::move(m);
  return {};
}

}  // namespace jaxcoll::cuda
