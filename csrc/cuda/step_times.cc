#include "csrc/cuda/step_times.hpp"

#include <cuda_runtime.h>

#include <cstring>

#include "csrc/cuda/cuda_status.hpp"
#include "csrc/trace.hpp"

namespace jaxcoll::cuda {

struct StepTimes::Buffer {
  explicit Buffer(StepTimes* o) : owner(o) {}
  ~Buffer() {
    if (host) cudaFreeHost(host);
  }
  StepTimes* owner;
  uint64_t* host = nullptr;    // pinned, mapped into every device
  uint64_t* device = nullptr;  // the same memory as the kernel addresses it
  DeviceCall call;
};

StepTimes::StepTimes(const Plan& plan, const StepSizes& sizes, const DeviceCall& who)
    : plan_(plan), sizes_(sizes), who_(who), bytes_(size_t(2 * device_trace_slots(plan)) * sizeof(uint64_t)) {}

StepTimes::~StepTimes() = default;

Status StepTimes::begin(CUstream_st* stream, Buffer*& call, uint64_t*& times) {
  call = nullptr;
  times = nullptr;
  if (!tracing() || bytes_ == 0) return {};
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  JAXCOLL_CUDA_TRY(cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &capture),
                   "cudaStreamIsCapturing (traced call)");
  if (capture != cudaStreamCaptureStatusNone) return {};
  Buffer* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    }
  }
  if (!b) {  // the first traced call of this launcher, or more calls in flight at once than before
    auto owned = std::make_unique<Buffer>(this);
    void* host = nullptr;
    JAXCOLL_CUDA_TRY(cudaHostAlloc(&host, bytes_, cudaHostAllocMapped | cudaHostAllocPortable),
                     "cudaHostAlloc of a traced call's step times");
    owned->host = static_cast<uint64_t*>(host);
    void* device = nullptr;
    JAXCOLL_CUDA_TRY(cudaHostGetDevicePointer(&device, host, 0),
                     "cudaHostGetDevicePointer of a traced call's step times");
    owned->device = static_cast<uint64_t*>(device);
    b = owned.get();
    std::lock_guard<std::mutex> lock(mu_);
    all_.push_back(std::move(owned));
  }
  std::memset(b->host, 0, bytes_);  // 0: a step not reached
  b->call = who_;
  b->call.call = next_traced_call();
  static const int64_t offset = globaltimer_offset_ns();  // once a process: the clocks' offset drifts slowly
  b->call.clock_offset_ns = offset;
  call = b;
  times = b->device;
  return {};
}

Status StepTimes::end(CUstream_st* stream, Buffer* b) {
  if (!b) return {};
  if (cudaError_t err = cudaLaunchHostFunc(reinterpret_cast<cudaStream_t>(stream), &StepTimes::record, b);
      err != cudaSuccess) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(b);
    JAXCOLL_CUDA_TRY(err, "cudaLaunchHostFunc (a traced call's step times)");
  }
  return {};
}

void StepTimes::record(void* buffer) {
  Buffer* b = static_cast<Buffer*>(buffer);
  StepTimes& self = *b->owner;
  b->call.read_ns = trace_now_ns();
  for (const TraceEvent& e : device_step_events(self.plan_, self.sizes_, b->call, b->host)) record_trace_event(e);
  std::lock_guard<std::mutex> lock(self.mu_);
  self.free_.push_back(b);
}

}  // namespace jaxcoll::cuda
