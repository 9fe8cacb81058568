// Per-step event traces of the CPU executor (jaxcoll.trace, docs/observability.md): while tracing is on, the lanes
// (lanes.cc) record each step they run, with its start and end on the host's monotonic clock, into a buffer of the
// thread that ran it. The Python side turns the events into a Chrome/Perfetto trace file.
//
// Off, tracing costs one relaxed load per call (GroupRun reads the switch once) and a branch on a member per step.
// On, an event is two clock reads and an append to the thread's own buffer under its own lock, which only a
// reader of the trace contends for: no lock shared between the threads that run lanes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace jaxcoll {

// One step of one lane of one rank in one call. Plain fields of 8 and 4 bytes, no padding: the Python side reads
// an array of them with a numpy dtype of the same layout (jaxcoll/observe/trace_events.py, which checks the size
// against trace_event_size()).
struct TraceEvent {
  int64_t start_ns;  // CLOCK_MONOTONIC (steady_clock), shared by every process of a host
  int64_t end_ns;
  int64_t callsite;  // the custom call's callsite (-1: runtime.run_plan)
  int64_t call;      // which call: numbered per process in the order calls start (while tracing)
  int64_t bytes;     // data steps: the bytes of the step's chunk range (each source and destination holds these)
  int32_t group;     // the group of the call site's groups
  int32_t rank;      // the rank in its group
  int32_t lane;
  int32_t step;      // the step's position in its lane
  int32_t op;        // the plan's op code (plan/abi.py)
  int32_t peer;      // signal: the rank signalled; wait: the rank whose plan signals it (-2: several, -1: none);
                     // data steps: the first other rank a chunk of the step belongs to (-1: all local)
  int32_t sem;       // signal / wait: the semaphore (on the rank signalled / on this rank); else -1
  int32_t count;     // wait: which signal of the semaphore it consumed (1, 2, ...); signal: 1; else 0
  int32_t flags;     // kTraceUnfinished: the step had not ended when the call failed (end_ns: when it failed)
  // A call of a group spanning processes, as every process of the job names it (each numbers `call` its own way):
  // its count within its launch at this call site (1, 2, ...; 0: a call of one process's group) and the launch,
  // XLA's run id of the lowest process of the group, so that the files of a job can be read as one.
  int32_t iteration = 0;
  int64_t launch = 0;
};
static_assert(sizeof(TraceEvent) == 88, "TraceEvent's layout is read by jaxcoll/observe/trace_events.py");

// A call of a group spanning processes as the job names it (TraceEvent::launch and iteration); {0, 0} for a call
// of one process's group.
struct JobCall {
  int64_t launch = 0;
  int32_t iteration = 0;
};

inline constexpr int32_t kTraceUnfinished = 1;
// The op and lane of an arrival event: from a rank's arrival at its call until the call starts (its peers'
// arrival), on a track of its own.
inline constexpr int32_t kTraceArrival = -1;
// Rank `rank`'s wait for its peers at call `call` of (callsite, group), from `arrived_ns` to `end_ns`.
TraceEvent arrival_event(int64_t callsite, int64_t call, int32_t group, JobCall job, int32_t rank, int64_t arrived_ns,
                         int64_t end_ns, int32_t flags);

// Whether calls starting now are traced: one relaxed load.
bool tracing();
// Tracing is on while at least one tracer is open (jaxcoll.trace blocks and JAXCOLL_TRACE's whole-run tracer).
void open_tracer();
void close_tracer();

// The number of a traced call (GroupRun takes one per call while tracing).
int64_t next_traced_call();
int64_t trace_now_ns();

// Append to the calling thread's buffer. A thread keeps its last kTraceEventsPerThread events: a long run keeps
// the steps before a hang, in bounded memory.
inline constexpr size_t kTraceEventsPerThread = size_t{1} << 20;
void record_trace_event(const TraceEvent& e);

// Every thread's events so far (each thread's in order); `clear` forgets them. `dropped` gets the events
// overwritten since the last clear.
std::vector<TraceEvent> trace_events(bool clear, uint64_t& dropped);

}  // namespace jaxcoll
