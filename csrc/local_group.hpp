// A whole group in one process without XLA: one std::thread per rank runs the executor on a fresh
// communicator. This is how the planning side (language, synthesizers, tests) runs plans on the real executor.
#pragma once

#include <cstdint>
#include <vector>

#include "csrc/abi.hpp"
#include "csrc/dtype.hpp"
#include "csrc/plan.hpp"
#include "csrc/status.hpp"

namespace jaxcoll {

// inputs[r] / outputs[r] are rank r's buffers of input_elements / output_elements elements of `dtype`. On failure
// the message is the first failure (the root cause), not a peer's report of it.
Status run_local_group(const Plan& plan, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                       int64_t input_elements, int64_t output_elements, DType dtype, ReduceOp op, double timeout_s);

}  // namespace jaxcoll
