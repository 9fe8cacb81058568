// The CPU executor: runs one rank's share of a plan on the calling (device) thread. The rank's lanes are
// interleaved cooperatively: a lane runs until it blocks on a wait whose signal has not arrived or on a lane
// barrier, then the next lane runs; the thread sleeps on its doorbell only when no lane can progress.
#pragma once

#include <cstdint>

#include "communicator.hpp"
#include "dtype.hpp"
#include "plan.hpp"
#include "status.hpp"

namespace jaxcoll {

// One rank's operands of one call, as XLA (or run_plan) hands them over.
struct CallBuffers {
  const void* input;
  void* output;
  int64_t input_elements;
  int64_t output_elements;
  DType dtype;
  ReduceOp op;
};

// Run rank `rank`'s lanes of `plan` between the entry rendezvous and the exit barrier of its call on `comm`: the
// call of launch `run_id` (XLA's run id, shared by every device of one launch) that this rank has not run yet.
// In-place plans are staged as docs/plan-ir.md says. On error the communicator is marked failed so peers stop
// promptly.
Status execute_rank(Communicator& comm, int64_t run_id, const Plan& plan, int32_t rank, const CallBuffers& buffers,
                    const CallSite& site, double timeout_s);

// Calls whose per-rank input is at most this many bytes run solo: the last rank to arrive runs every rank's
// lanes, so the call costs one rendezvous and no cross-thread signals. JAXCOLL_SOLO_BYTES sets the initial
// value (default 256 KiB); 0 turns solo calls off.
int64_t solo_bytes();
void set_solo_bytes(int64_t bytes);

// The timeout of a call in seconds: JAXCOLL_TIMEOUT, default 300 (read once).
double default_timeout_s();

}  // namespace jaxcoll
