// The step times of traced calls on the CUDA executor (jaxcoll.trace, docs/observability.md): while tracing is
// on, a call's kernel writes %globaltimer before and after each step into a host-mapped buffer
// (KernelParams::step_times), and a host function enqueued after the call's last work turns them into the same
// TraceEvents the CPU executor records (csrc/trace_steps.hpp). Calls captured into a CUDA graph are not traced:
// a graph replays the parameters it captured, so every replay would write one buffer that no host function reads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "csrc/plan.hpp"
#include "csrc/status.hpp"
#include "csrc/trace_steps.hpp"

struct CUstream_st;

namespace jaxcoll::cuda {

class StepTimes {
 public:
  // `who`: the launcher's call site, group and launched ranks (its call number and clocks are set per call).
  StepTimes(const Plan& plan, const StepSizes& sizes, const DeviceCall& who);
  ~StepTimes();
  StepTimes(const StepTimes&) = delete;
  StepTimes& operator=(const StepTimes&) = delete;

  // One traced call's buffer.
  struct Buffer;

  // Before a call's kernel: its buffer, and in `times` the address the kernel writes its steps' times to; both
  // null when the call is not traced (tracing off, or `stream` capturing a graph). A traced call is ended with
  // `end` on the same stream (a call whose enqueue fails keeps its buffer until the launcher goes).
  Status begin(CUstream_st* stream, Buffer*& call, uint64_t*& times);
  // After the call's last work on `stream`: a host function records the call's events once it has run, and
  // gives the buffer back. The launcher's owner synchronises its streams before destroying it (the kernel reads
  // the launcher's device arrays too), so the host function never outlives this.
  Status end(CUstream_st* stream, Buffer* call);

 private:
  static void record(void* buffer);

  const Plan& plan_;
  const StepSizes sizes_;
  const DeviceCall who_;
  const size_t bytes_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Buffer>> all_;  // every buffer of this launcher
  std::vector<Buffer*> free_;                 // those no call uses now
};

}  // namespace jaxcoll::cuda
