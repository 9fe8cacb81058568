#include "csrc/call_stats.hpp"

#include <algorithm>
#include <map>
#include <mutex>

namespace jaxcoll {
namespace {

struct Site {
  CallStats stats;
  size_t next = 0;  // where the next call goes in `recent` once it is full (a ring)
};

std::mutex mu;
std::map<int64_t, Site>& sites() {
  static auto* s = new std::map<int64_t, Site>();  // never destroyed: handlers may record during exit
  return *s;
}

}  // namespace

void record_call(int64_t callsite, int64_t bytes, double seconds) {
  std::lock_guard<std::mutex> lock(mu);
  Site& site = sites()[callsite];
  CallStats& s = site.stats;
  s.callsite = callsite;
  s.bytes = bytes;
  s.min_s = s.calls ? std::min(s.min_s, seconds) : seconds;
  s.max_s = s.calls ? std::max(s.max_s, seconds) : seconds;
  ++s.calls;
  if (s.recent.size() < kRecentCalls) {
    s.recent.push_back(seconds);
  } else {
    s.recent[site.next] = seconds;
    site.next = (site.next + 1) % kRecentCalls;
  }
}

std::vector<CallStats> call_stats(bool reset) {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<CallStats> out;
  for (auto& [callsite, site] : sites()) {
    CallStats s = site.stats;
    std::rotate(s.recent.begin(), s.recent.begin() + static_cast<std::ptrdiff_t>(site.next), s.recent.end());
    out.push_back(std::move(s));
  }
  if (reset) sites().clear();
  return out;
}

}  // namespace jaxcoll
