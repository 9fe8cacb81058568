#include "csrc/trace.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

namespace jaxcoll {
namespace {

std::atomic<int32_t> tracers{0};
std::atomic<int64_t> calls{0};

// One thread's events: a ring once full, so the newest are kept.
struct ThreadEvents {
  std::mutex mu;
  std::vector<TraceEvent> events;
  size_t next = 0;  // where the next event goes once `events` is full
  uint64_t dropped = 0;
};

// Every thread's buffer, owned here as well as by the thread: a thread that exits leaves its events to be read.
struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadEvents>> threads;
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: threads may record during exit
  return *r;
}

ThreadEvents& mine() {
  thread_local std::shared_ptr<ThreadEvents> t = [] {
    auto e = std::make_shared<ThreadEvents>();
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.threads.push_back(e);
    return e;
  }();
  return *t;
}

}  // namespace

bool tracing() { return tracers.load(std::memory_order_relaxed) > 0; }
void open_tracer() { tracers.fetch_add(1, std::memory_order_relaxed); }
void close_tracer() {
  int32_t n = tracers.load(std::memory_order_relaxed);
  while (n > 0 && !tracers.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) {
  }
}

TraceEvent arrival_event(int64_t callsite, int64_t call, int32_t group, JobCall job, int32_t rank, int64_t arrived_ns,
                         int64_t end_ns, int32_t flags) {
  TraceEvent e{arrived_ns, end_ns, callsite, call, 0, group, rank, kTraceArrival, -1, kTraceArrival, -1, -1, 0, flags};
  e.iteration = job.iteration;
  e.launch = job.launch;
  return e;
}

int64_t next_traced_call() { return calls.fetch_add(1, std::memory_order_relaxed); }

int64_t trace_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void record_trace_event(const TraceEvent& e) {
  ThreadEvents& t = mine();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.events.size() < kTraceEventsPerThread) {
    t.events.push_back(e);
    return;
  }
  t.events[t.next] = e;
  t.next = (t.next + 1) % kTraceEventsPerThread;
  ++t.dropped;
}

std::vector<TraceEvent> trace_events(bool clear, uint64_t& dropped) {
  std::vector<std::shared_ptr<ThreadEvents>> threads;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    threads = r.threads;
  }
  std::vector<TraceEvent> out;
  dropped = 0;
  for (auto& t : threads) {
    std::lock_guard<std::mutex> lock(t->mu);
    const auto oldest = t->events.begin() + static_cast<std::ptrdiff_t>(t->next);
    out.insert(out.end(), oldest, t->events.end());
    out.insert(out.end(), t->events.begin(), oldest);
    dropped += t->dropped;
    if (clear) {
      t->events.clear();
      t->events.shrink_to_fit();
      t->next = 0;
      t->dropped = 0;
    }
  }
  return out;
}

}  // namespace jaxcoll
