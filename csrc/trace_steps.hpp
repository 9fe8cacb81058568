// What a trace event says about one step of a plan, whichever executor ran it: the CPU lanes (lanes.cc) fill it
// as they run, the CUDA executor from the step times its kernel wrote (csrc/cuda/launcher.cc). One description,
// so a trace reads the same from either executor (docs/observability.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "csrc/plan.hpp"
#include "csrc/trace.hpp"

namespace jaxcoll {

// For each rank and semaphore, the rank whose plan signals it: -1 none, -2 several. Found once per traced call,
// so that a wait's event can say from whom its signal comes.
using SignalSources = std::vector<std::vector<int32_t>>;  // [rank][semaphore]
SignalSources signal_sources(const Plan& plan);

// The element sizes a step's bytes are counted in: the call's element type, and its accumulation type (scratch).
struct StepSizes {
  int64_t chunk_factor = 1;
  int64_t block = 0;  // elements of a block of the call
  size_t dsize = 0, asize = 0;
};

// The fields of step `s` of `rank` that depend on the plan alone: op, peer, semaphore, bytes, and count 1 for a
// signal. The caller sets the times, the identity (callsite, call, group, rank, lane, step), a wait's count and
// the flags.
void describe_step(const Plan& plan, const SignalSources& from, int32_t rank, const Step& s, const StepSizes& sizes,
                   TraceEvent& e);

// ---- the CUDA executor's step times ----
// The kernel's thread 0 of each lane's first block writes %globaltimer before and after each step into an array of
// two uint64 a step (start, end), the steps numbered as csrc/cuda/plan_image.cc lays them out: rank by rank, lane
// by lane (a rank's lanes padded to at least one), each lane's steps in order. 0: not reached (the call stopped).
int64_t device_trace_slots(const Plan& plan);

// Who a traced CUDA call was, for its events.
struct DeviceCall {
  int64_t callsite = -1;
  int64_t call = 0;
  int32_t group = 0;
  int32_t first_rank = 0, launch_ranks = 0;  // the ranks this launch ran
  // %globaltimer minus the host's monotonic clock (trace_now_ns), in ns: subtracted from every device time.
  int64_t clock_offset_ns = 0;
  // Host monotonic time when the host read the times: the end of a step that started and never ended.
  int64_t read_ns = 0;
};

// The events of the launched ranks' steps, from `times` (device_trace_slots(plan) pairs). Steps never reached are
// left out; a step that started and did not end is kTraceUnfinished, ending at `read_ns`. A wait's count is its
// position among its rank's waits on the semaphore plus one (the kernel's threshold for the call).
std::vector<TraceEvent> device_step_events(const Plan& plan, const StepSizes& sizes, const DeviceCall& call,
                                           const uint64_t* times);

// %globaltimer minus trace_now_ns, as far as the host can tell without a GPU round trip: the driver sets
// %globaltimer to ns since the Unix epoch from the host's wall clock, so this is CLOCK_REALTIME minus
// CLOCK_MONOTONIC now (docs/observability.md, "Clocks").
int64_t globaltimer_offset_ns();

}  // namespace jaxcoll
