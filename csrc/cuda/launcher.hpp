// The CUDA executor's host side: device memory and the launch of one call (docs/cuda.md). Nothing here
// includes CUDA headers, so xla_ffi/ and the Python module build with the ordinary C++ compiler; the CUDA
// runtime is linked statically and reached only through these functions. Every function that touches the
// driver returns a Status: on a machine without a GPU (or without a driver) they fail with a message instead
// of aborting, and `device_count` says so up front.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "csrc/abi.hpp"
#include "csrc/cuda/kernel_params.hpp"
#include "csrc/cuda/plan_image.hpp"
#include "csrc/cuda/step_times.hpp"
#include "csrc/dtype.hpp"
#include "csrc/plan.hpp"
#include "csrc/status.hpp"

struct CUstream_st;

namespace jaxcoll::cuda {

using Stream = CUstream_st*;

// Visible CUDA devices; 0 (with `why` set) where there is no driver or no device. Never throws or aborts.
int device_count(std::string* why = nullptr);

// Per-rank input bytes up to which "auto" plans use the packet protocol: JAXCOLL_CUDA_LL_BYTES, default 64 KiB.
int64_t ll_max_bytes();

// cudaMalloc'd memory on one device, freed on that device.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(DeviceMemory&& o) noexcept { *this = std::move(o); }
  DeviceMemory& operator=(DeviceMemory&& o) noexcept;
  ~DeviceMemory();
  // `bytes` zeroed bytes on `device`.
  static Status allocate(int device, size_t bytes, DeviceMemory& out);
  char* get() const { return ptr_; }
  size_t size() const { return bytes_; }
  int device() const { return device_; }

 private:
  char* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = -1;
};

// The error record of a group: pinned host memory mapped into every device, so kernels on any GPU report into
// it and the host reads it without synchronising.
class ErrorRecordMemory {
 public:
  static Status allocate(std::unique_ptr<ErrorRecordMemory>& out);
  ~ErrorRecordMemory();
  ErrorRecord* get() const { return rec_; }
  bool failed() const;

 private:
  ErrorRecord* rec_ = nullptr;
};

// Element type, reduction and sizes of the calls a group runs; fixed per group (XLA shapes are static).
struct CallShape {
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int64_t input_elements = 0;
  int64_t output_elements = 0;
  int64_t block = 0;  // input_elements / in_blocks
};

// Check the sizes against the plan (as the CPU executor does) and fill `shape.block`.
Status check_shape(const Plan& plan, CallShape& shape);

// Where everything lies in a rank's slot for these calls. `staged`: the group spans processes, so on the bulk
// protocol each rank's input and output are staged in its slot (peers map the slot, not XLA's buffers).
SlotLayout slot_layout(const PlanImage& image, const CallShape& shape, Protocol protocol, bool staged = false);

// Thread blocks per lane: enough to move large messages at full bandwidth (bulk) or to give every thread about
// one element of a lane's share (packets, where a call is a few polls long), few enough that every block of the
// launch is resident at once (waits spin; a block that is not resident would never be signalled). The same for
// every rank of a group, since waits count signals of all of a lane's blocks. JAXCOLL_CUDA_BLOCKS overrides.
Status choose_blocks_per_lane(const PlanImage& image, const CallShape& shape, int device, int launch_ranks,
                              Protocol protocol, int& blocks);

// The blocks per lane a call of `shape` would take before the device's residency caps them (no GPU needed).
int wanted_blocks_per_lane(const PlanImage& image, const CallShape& shape, Protocol protocol);

// The most lane thread blocks of this kernel one device can hold resident at once.
Status resident_blocks(int device, const CallShape& shape, int& blocks);

// One device's view of a group: the plan on the device, the slot table as this device addresses the slots,
// the ranks this device launches. Enqueuing a call does no host synchronisation and allocates nothing, so it
// may be captured into a CUDA graph.
class Launcher {
 public:
  struct Options {
    int device = 0;
    int first_rank = 0;
    int launch_ranks = 1;
    Protocol protocol = Protocol::kBulk;
    int blocks_per_lane = 1;
    double timeout_s = 300;
    bool staged = false;  // bulk protocol across processes: stage XLA's buffers in the slot (slot_layout)
    // Every rank's slot is on `device` (the emulated-rank harness), so no word needs more than device scope.
    bool one_device = false;
    PacketPolls polls = PacketPolls::kDefault;    // kDefault: JAXCOLL_CUDA_POLL, else in flight
    CounterScope scope = CounterScope::kDefault;  // kDefault: JAXCOLL_CUDA_SCOPE, else the narrowest
    // Who the calls are in traces (jaxcoll.trace): the call site (-1: the emulated-rank harness) and group.
    int64_t callsite = -1;
    int32_t group = 0;
  };
  static Status create(const Plan& plan, const PlanImage& image, const CallShape& shape, const SlotLayout& layout,
                       const std::vector<char*>& slots, ErrorRecord* error, const Options& options,
                       std::unique_ptr<Launcher>& out);

  // One call of ranks [first_rank, first_rank + launch_ranks): inputs[i] and outputs[i] are those ranks'
  // buffers on the device. In-place plans, and every plan of a staged launcher, are staged with device copies on
  // `stream` around the kernel.
  Status enqueue(const void* const* inputs, void* const* outputs, Stream stream) const;

  // The message of a failure recorded by the kernel, naming the rank, lane, step and semaphore.
  std::string describe_failure(const ErrorRecord& rec) const;

  const Options& options() const { return options_; }

 private:
  Launcher() = default;
  const Plan* plan_ = nullptr;
  const PlanImage* image_ = nullptr;
  CallShape shape_;
  Options options_;
  DeviceMemory arrays_;  // the plan image and the slot table, on the device
  KernelParams params_{};
  std::vector<char*> own_slots_;  // slots of the launched ranks (host view, for staging copies)
  std::unique_ptr<StepTimes> step_times_;  // traced calls' step times (csrc/cuda/step_times.hpp)
};

}  // namespace jaxcoll::cuda
