// The runtime's settings from the environment: every JAXCOLL_* variable the C++ side reads is read here, once, and
// nowhere else (docs/runtime.md, "Settings", lists each with its default and meaning). A field is empty where its
// variable is unset or empty: the code that owns the setting applies its default there, next to the reason for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace jaxcoll {

struct EnvSettings {
  std::optional<int64_t> solo_bytes;     // JAXCOLL_SOLO_BYTES     csrc/executor.cc
  std::optional<double> timeout_s;       // JAXCOLL_TIMEOUT        csrc/executor.cc
  std::optional<int64_t> sync_wait_us;   // JAXCOLL_SYNC_WAIT_US   csrc/executor.cc
  bool log_joins = false;                // JAXCOLL_LOG_JOINS      csrc/executor.cc, csrc/cross_process.cc
  std::optional<int> spin;               // JAXCOLL_SPIN           csrc/wait.cc
  std::optional<int> yield;              // JAXCOLL_YIELD          csrc/wait.cc
  std::optional<size_t> hugepage_bytes;  // JAXCOLL_HUGEPAGE_BYTES csrc/memory.cc
  std::optional<size_t> nt_bytes;        // JAXCOLL_NT_BYTES       csrc/reduce.cc
  std::optional<size_t> nt_call_bytes;   // JAXCOLL_NT_CALL_BYTES  csrc/reduce.cc
  std::optional<int> span_helpers;       // JAXCOLL_SPAN_HELPERS   csrc/cross_process.cc
  std::optional<int64_t> net_delay_us;   // JAXCOLL_NET_DELAY_US   csrc/net.cc
  std::optional<int64_t> cuda_ll_bytes;  // JAXCOLL_CUDA_LL_BYTES  csrc/cuda/launcher.cc
  std::optional<int> cuda_blocks;        // JAXCOLL_CUDA_BLOCKS    csrc/cuda/launcher.cc
  std::optional<std::string> cuda_poll;  // JAXCOLL_CUDA_POLL      csrc/cuda/launcher.cc
  std::optional<std::string> cuda_scope; // JAXCOLL_CUDA_SCOPE     csrc/cuda/launcher.cc
  // Empty, or one sentence per malformed variable naming it and its value (that field is left empty). Reading
  // never throws, since the first read may come on any thread; jaxcoll.runtime raises this as a ValueError when
  // it loads the module (`_jaxcoll.check_environment`), before any call runs.
  std::string error;
};

// The settings, read from the environment on the first call (thread-safe) and kept for the process's life.
const EnvSettings& env_settings();

}  // namespace jaxcoll
