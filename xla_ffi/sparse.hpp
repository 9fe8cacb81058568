// The XLA FFI handlers of the sparse all-reduce's local stages (csrc/topk.hpp): stateless, one execute stage
// each, registered by jaxcoll.runtime for platform "cpu" under the names of csrc/abi.hpp's kSparseTargets.
#pragma once

#include <array>
#include <utility>

#include "xla/ffi/api/c_api.h"

namespace jaxcoll::xla_cpu {

// (target name, handler) for every sparse target, in kSparseTargets' order.
std::array<std::pair<const char*, XLA_FFI_Handler*>, 4> sparse_handlers();

}  // namespace jaxcoll::xla_cpu
