#include "csrc/env.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>

namespace jaxcoll {
namespace {

// Each reader takes the whole value or none of it: "4M" or "1e3" for a byte count is an error, not 4 or 1.
class Reader {
 public:
  // An integer in [lo, hi].
  template <typename T>
  std::optional<T> integer(const char* name, T lo, T hi, const char* what) {
    const char* v = value(name);
    if (!v) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v, &end, 10);
    if (errno || end == v || *end != '\0' || x < static_cast<long long>(lo) ||
        static_cast<unsigned long long>(x) > static_cast<unsigned long long>(hi)) {
      malformed(name, v, what);
      return std::nullopt;
    }
    return static_cast<T>(x);
  }

  // A finite number of seconds above 0.
  std::optional<double> seconds(const char* name) {
    const char* v = value(name);
    if (!v) return std::nullopt;
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    if (end == v || *end != '\0' || !std::isfinite(x) || !(x > 0)) {
      malformed(name, v, "a number of seconds above 0");
      return std::nullopt;
    }
    return x;
  }

  // 1 (on) or 0 (off).
  bool flag(const char* name) {
    const char* v = value(name);
    if (!v) return false;
    if (v[0] && !v[1] && (v[0] == '0' || v[0] == '1')) return v[0] == '1';
    malformed(name, v, "1 (on) or 0 (off)");
    return false;
  }

  // One of `choices` (a " or "-separated list, as the message names them).
  std::optional<std::string> choice(const char* name, std::initializer_list<const char*> choices, const char* what) {
    const char* v = value(name);
    if (!v) return std::nullopt;
    for (const char* c : choices)
      if (std::string(v) == c) return std::string(v);
    malformed(name, v, what);
    return std::nullopt;
  }

  std::string error;

 private:
  static const char* value(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? v : nullptr;
  }

  void malformed(const char* name, const char* v, const char* what) {
    error += std::string(error.empty() ? "" : "; ") + name + "='" + v + "' is not " + what;
  }
};

constexpr int kMaxInt = std::numeric_limits<int>::max();
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

EnvSettings read_env() {
  Reader r;
  EnvSettings s;
  const char* bytes = "a byte count (a whole number >= 0)";
  const char* count = "a whole number >= 0";
  s.solo_bytes = r.integer<int64_t>("JAXCOLL_SOLO_BYTES", 0, kMaxInt64, bytes);
  s.timeout_s = r.seconds("JAXCOLL_TIMEOUT");
  s.sync_wait_us = r.integer<int64_t>("JAXCOLL_SYNC_WAIT_US", 0, kMaxInt64, "a whole number of microseconds >= 0");
  s.log_joins = r.flag("JAXCOLL_LOG_JOINS");
  s.spin = r.integer<int>("JAXCOLL_SPIN", 0, kMaxInt, count);
  s.yield = r.integer<int>("JAXCOLL_YIELD", 0, kMaxInt, count);
  s.hugepage_bytes = r.integer<size_t>("JAXCOLL_HUGEPAGE_BYTES", 0, kMaxInt64, bytes);
  s.nt_bytes = r.integer<size_t>("JAXCOLL_NT_BYTES", 0, kMaxInt64, bytes);
  s.nt_call_bytes = r.integer<size_t>("JAXCOLL_NT_CALL_BYTES", 0, kMaxInt64, bytes);
  s.span_helpers = r.integer<int>("JAXCOLL_SPAN_HELPERS", 0, kMaxInt, count);
  s.net_delay_us = r.integer<int64_t>("JAXCOLL_NET_DELAY_US", 0, kMaxInt64, "a whole number of microseconds >= 0");
  s.cuda_ll_bytes = r.integer<int64_t>("JAXCOLL_CUDA_LL_BYTES", 0, kMaxInt64, bytes);
  // At most 32: a semaphore of the CUDA executor is one counter per block of a lane (kMaxBlocksPerLane).
  s.cuda_blocks = r.integer<int>("JAXCOLL_CUDA_BLOCKS", 1, 32, "a whole number 1..32");
  s.cuda_poll = r.choice("JAXCOLL_CUDA_POLL", {"in_flight", "in_order"}, "in_flight or in_order");
  s.cuda_scope = r.choice("JAXCOLL_CUDA_SCOPE", {"narrowest", "system"}, "narrowest or system");
  if (!r.error.empty())
    s.error = "malformed jaxcoll setting in the environment: " + r.error +
              " (unset a variable for its default; docs/runtime.md, \"Settings\", lists them)";
  return s;
}

}  // namespace

const EnvSettings& env_settings() {
  static const EnvSettings s = read_env();
  return s;
}

}  // namespace jaxcoll
