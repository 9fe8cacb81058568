// The runtime's settings from the environment (JAXCOLL_*), each read once by the function that owns it. An
// unset or empty variable means the default.
#pragma once

#include <cstddef>
#include <cstdlib>

namespace jaxcoll {

// A byte count: the number at the start of the value (strtoull).
inline size_t env_bytes(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) : fallback;
}

// A small count: the whole value must be a non-negative integer, else the default.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (end && *end == '\0' && x >= 0) ? static_cast<int>(x) : fallback;
}

}  // namespace jaxcoll
