// The CPU executor of a group whose ranks are all in this process. The last rank of a group to arrive at a call
// (the leader) runs every rank's lanes (lanes.hpp); the ranks before it publish their buffers and return pending
// (see communicator.hpp for why no rank waits for its peers). Larger calls are shared with helper threads: the
// ranks still waiting on their own device threads and XLA's intra-op pool. Groups that span processes run in
// cross_process.hpp.
#pragma once

#include <cstdint>
#include <functional>

#include "csrc/communicator.hpp"
#include "csrc/dtype.hpp"
#include "csrc/lanes.hpp"
#include "csrc/plan.hpp"
#include "csrc/status.hpp"

namespace jaxcoll {

// Threads that may help run a call: `schedule` runs a task on another thread (or inline); up to `count` tasks are
// scheduled for one call. Tasks that start after the call has finished return at once.
struct Helpers {
  std::function<void(std::function<void()>)> schedule;
  int count = 0;
};

// Rank `rank`'s part of the call of launch `run_id` (XLA's run id, shared by every device of one launch) that this
// rank has not run yet. If this rank is not the last to arrive, returns OK with `pending` set: `completion` is
// called later, exactly once, with the call's status, on the thread that finishes the call. Otherwise the call
// runs now (with `helpers`) and its status is returned; `completion` is not called. In-place plans are staged as
// docs/plan-ir.md says. On error the communicator is marked failed so that every pending rank learns of it.
Status execute_rank(Communicator& comm, int64_t run_id, const Plan& plan, int32_t rank, const CallBuffers& buffers,
                    const CallSite& site, double timeout_s, const Helpers& helpers, Completion completion,
                    bool& pending);

// Calls that read and write at most this many bytes in all (every rank's steps together) run solo: the leader
// alone runs every rank's lanes (waking helpers costs more than the data moves). JAXCOLL_SOLO_BYTES sets the
// initial value (default 2 MiB: the 8-rank two-shot all_reduce of 128 KiB per rank; at 256 KiB, 4 MiB moved,
// sharing measured 0.55 ms a call against 0.64 solo, docs/benchmarks.md "Every shared call, every waiting
// rank"); 0 shares every call with the helpers.
int64_t solo_bytes();
void set_solo_bytes(int64_t bytes);

// The timeout of a call in seconds: JAXCOLL_TIMEOUT, default 300 (read once).
double default_timeout_s();

// How long a rank that arrives before its call can run waits on its own thread for the call to finish, before it
// returns pending: JAXCOLL_SYNC_WAIT_US, default 2000 (read once).
Clock::duration sync_wait();

}  // namespace jaxcoll
