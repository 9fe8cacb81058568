#include "csrc/trace_steps.hpp"

#include <algorithm>
#include <chrono>

#include "csrc/layout.hpp"

namespace jaxcoll {

SignalSources signal_sources(const Plan& plan) {
  SignalSources from(plan.nranks);
  for (int32_t r = 0; r < plan.nranks; ++r) from[r].assign(plan.ranks[r].semaphores, -1);
  plan.for_each_step([&](int32_t r, int32_t, int32_t, const Step& s) {
    if (s.op != Op::kSignal) return;
    int32_t& f = from[s.peer][s.sem];
    f = f == -1 || f == r ? r : -2;
  });
  return from;
}

void describe_step(const Plan& plan, const SignalSources& from, int32_t rank, const Step& s, const StepSizes& sizes,
                   TraceEvent& e) {
  e.op = static_cast<int32_t>(s.op);
  e.peer = -1;
  e.sem = -1;
  e.bytes = 0;
  e.count = 0;
  if (s.op == Op::kSignal) {
    e.peer = s.peer;
    e.sem = s.sem;
    e.count = 1;
  } else if (s.op == Op::kWait) {
    e.peer = from[rank][s.sem];
    e.sem = s.sem;
  } else if (s.is_data()) {
    const ChunkRef* refs = plan.srcs(s);
    const ChunkRef& dst = refs[s.nsrc];
    e.bytes = chunk_range(sizes.chunk_factor, sizes.block, dst.index, dst.count).size() *
              int64_t(dst.buffer == BufferKind::kScratch ? sizes.asize : sizes.dsize);
    for (int32_t j = 0; j < s.nsrc + s.ndst && e.peer < 0; ++j)
      if (refs[j].rank != rank) e.peer = refs[j].rank;
  }
}

int64_t device_trace_slots(const Plan& plan) {
  int64_t n = 0;
  for (int32_t r = 0; r < plan.nranks; ++r) {
    const RankProgram& p = plan.ranks[r];
    for (int32_t l = 0; l < p.nlanes; ++l) n += plan.lanes[p.first_lane + l].nsteps;
  }
  return n;
}

std::vector<TraceEvent> device_step_events(const Plan& plan, const StepSizes& sizes, const DeviceCall& call,
                                           const uint64_t* times) {
  const SignalSources from = signal_sources(plan);
  std::vector<TraceEvent> out;
  int64_t slot = 0;  // the step's number in the kernel's layout
  for (int32_t r = 0; r < plan.nranks; ++r) {
    const RankProgram& p = plan.ranks[r];
    const bool launched = r >= call.first_rank && r < call.first_rank + call.launch_ranks;
    std::vector<int32_t> waits(p.semaphores, 0);  // each semaphore's waits so far, in the kernel's ordinal order
    for (int32_t l = 0; l < p.nlanes; ++l) {
      const Lane& lane = plan.lanes[p.first_lane + l];
      for (int32_t i = 0; i < lane.nsteps; ++i, ++slot) {
        const Step& s = plan.steps[lane.first_step + i];
        const int32_t ordinal = s.op == Op::kWait ? waits[s.sem]++ : 0;
        const uint64_t start = times[2 * slot], end = times[2 * slot + 1];
        if (!launched || start == 0) continue;
        TraceEvent e{};
        describe_step(plan, from, r, s, sizes, e);
        e.start_ns = int64_t(start) - call.clock_offset_ns;
        e.end_ns = end ? int64_t(end) - call.clock_offset_ns : std::max(call.read_ns, e.start_ns);
        e.flags = end ? 0 : kTraceUnfinished;
        e.callsite = call.callsite;
        e.call = call.call;
        e.group = call.group;
        e.rank = r;
        e.lane = l;
        e.step = i;
        if (s.op == Op::kWait) e.count = ordinal + 1;
        out.push_back(e);
      }
    }
  }
  return out;
}

int64_t globaltimer_offset_ns() {
  const int64_t realtime = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::system_clock::now().time_since_epoch()).count();
  return realtime - trace_now_ns();
}

}  // namespace jaxcoll
