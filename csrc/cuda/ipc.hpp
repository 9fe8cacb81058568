// Slots shared between processes (docs/cuda.md, "Groups across processes"): a rank exports its slot as a CUDA
// IPC handle, the handle travels through the host's shared memory (slot_exchange.hpp), and every peer process maps
// it. These are the primitives of that path.
#pragma once

#include <array>
#include <string>

#include "csrc/cuda/launcher.hpp"

namespace jaxcoll::cuda {

// The 64 opaque bytes of a cudaIpcMemHandle_t, as they go into the key-value store.
using IpcHandle = std::array<char, 64>;

// The handle of `memory` (which must be the start of its own cudaMalloc allocation, as slots are).
Status export_ipc_handle(const DeviceMemory& memory, IpcHandle& out);

// A peer process's allocation mapped into this one on `device`, unmapped on destruction.
class PeerMapping {
 public:
  PeerMapping() = default;
  PeerMapping(PeerMapping&& o) noexcept { *this = std::move(o); }
  PeerMapping& operator=(PeerMapping&& o) noexcept;
  ~PeerMapping();
  static Status open(const IpcHandle& handle, int device, PeerMapping& out);
  char* get() const { return ptr_; }

 private:
  char* ptr_ = nullptr;
  int device_ = -1;
};

}  // namespace jaxcoll::cuda
