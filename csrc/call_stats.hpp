// How often each call site ran and how long its calls took, since the process started or the last reset
// (jaxcoll.stats()): the handlers record one rank of each call, the Python side names the sites. Recording takes
// a lock per call of that rank only, which is noise next to a call's rendezvous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace jaxcoll {

struct CallStats {
  int64_t callsite = 0;
  uint64_t calls = 0;
  int64_t bytes = 0;           // the recorded rank's input bytes in a call
  double min_s = 0, max_s = 0;
  std::vector<double> recent;  // the last kRecentCalls calls' seconds, oldest first (for a median)
};

// Calls kept per site for the median: a steady state's spread, without memory that grows with a long run.
inline constexpr size_t kRecentCalls = 1024;

// One call of `callsite` that took `seconds`.
void record_call(int64_t callsite, int64_t bytes, double seconds);

// Every site that ran, ordered by callsite; `reset` forgets them after reading.
std::vector<CallStats> call_stats(bool reset);

}  // namespace jaxcoll
