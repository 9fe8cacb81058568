// Communicators: the meeting points of the ranks of one group at one call site (docs/plan-ir.md, "What the
// executor guarantees"). A Communicator is keyed by (callsite, group) and owned by the compiled calls that run
// its call site: when XLA drops the last executable holding the call site (the function is dropped, or
// jax.clear_caches()), its rendezvous and their scratch and staging memory go with it. A program recompiled in a
// loop lowers a new call site each time, so a communicator that lived as long as the process would hold every
// compilation's scratch for ever.
//
// XLA:CPU may run consecutive launches of a program concurrently on one device (each device admits several
// computations in flight), so "the n-th call of a rank" is not enough to pair calls: a call is identified by
// the launch's run id (shared by every device of one launch) and by how many times this rank has run the call
// site within that launch (a call site inside a loop runs once per iteration). Each such call gets its own
// Rendezvous: N slots with published buffers and semaphores, and the completions of the ranks that arrived
// first. Finished rendezvous are recycled with their scratch and staging memory, so the steady state allocates
// nothing.
//
// No rank ever blocks waiting for its peers. XLA:CPU runs independent thunks of a program concurrently and
// offloads some of them to its small intra-op thread pool; a collective that blocked a pool thread until every
// peer arrived could wait for a peer whose own call sits queued behind it on that same pool (seen here: two
// independent all-reduces, ranks 6 and 7 never arriving). So a rank that arrives before the last publishes its
// buffers and a completion and returns at once (XLA gets a pending future); the last rank to arrive runs the
// call for the whole group and completes the others.
//
// A failure (timeout, bad buffer) marks the communicator failed and completes every pending rank with the
// error; a failed communicator stays failed for the life of its call site. A watchdog thread fails a call whose
// peers do not all arrive within the timeout, naming the ranks that never did.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "csrc/dtype.hpp"
#include "csrc/lanes.hpp"
#include "csrc/status.hpp"
#include "csrc/wait.hpp"

namespace jaxcoll {

// Memory that grows but never shrinks: per-slot scratch and in-place staging, reused across calls.
class GrowableBuffer {
 public:
  void* reserve(size_t bytes);
  void* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  size_t size_ = 0;
};

// What a rank publishes at entry so its peers can address its buffers.
struct RankBuffers {
  void* input = nullptr;
  void* output = nullptr;
  void* scratch = nullptr;
  int64_t block = 0;  // elements per block: every rank of a call must agree
  DType dtype = DType::kF32;
};

// How a rank that arrived before the last learns that its call has finished: called exactly once, with the
// call's status, on whichever thread finishes the call.
using Completion = std::function<void(const Status&)>;

// A copy the call owes a rank after its steps: an in-place reduce_scatter runs in staging and copies block r out.
struct CopyOut {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

struct RankSlot {
  std::unique_ptr<std::atomic<uint32_t>[]> semaphores;
  int32_t nsemaphores = 0;
  RankBuffers buffers;
  CopyOut copy_out;
  Completion completion;  // kept when this rank arrived before the last
  // Whether a rank that arrived before the last is still waiting on its own thread (kWaiting), was finished
  // there by the leader (kDone), or gave up waiting and is owed its completion (kDeferred); see arrive().
  std::atomic<int> handoff{0};
  bool arrived = false;  // for error messages
  int64_t arrived_ns = 0;  // when the rank arrived, in a traced call (trace.hpp's clock); else 0
  GrowableBuffer scratch;
  GrowableBuffer staging;
};

// Identifies a call in error messages.
struct CallSite {
  const char* collective = "custom";
  int64_t callsite = 0;
  int32_t group = 0;
  std::string describe() const;
};

class Communicator;

// One call of a call site by every rank of its group.
class Rendezvous {
 public:
  Rendezvous(Communicator& owner, int32_t nranks);
  RankSlot& slot(int32_t rank) { return slots_[rank]; }
  Communicator& owner() { return owner_; }
  int32_t nranks() const { return nranks_; }

  // Publish this rank's buffers (resetting its semaphores, sized to `nsemaphores`) and arrive. The last rank to
  // arrive gets kLeader: it must run the call, then finish(). A rank before it gets kPending and may wait on its
  // own thread a short while (wait_finished) for the leader to finish it there; if the leader has not by then, the
  // rank defers (defer) and its `completion` is called when the call is done. kFailed means the call had already
  // failed (the communicator says why) and `completion` was not kept.
  enum class Arrival { kLeader, kPending, kFailed };
  Arrival arrive(int32_t rank, int32_t nsemaphores, const RankBuffers& buffers, const CopyOut& copy_out,
                 Completion completion, Clock::time_point deadline);

  // A pending rank waits on its own thread until `until` for the leader to finish the call; true if it did (the
  // call's status is then status()). If the leader shares the call (share) before `until`, the rank helps run it
  // on this thread and then waits for the finish until `deadline`: every rank has arrived, so the wait is only as
  // long as the call itself.
  bool wait_finished(int32_t rank, Clock::time_point until, Clock::time_point deadline);
  // The leader offers the running call to the ranks still waiting on their own threads (XLA's device threads:
  // on a machine shared with other work, a call run by eight threads gets the share of the cores XLA's own
  // collectives get, and one run by the leader and a pool thread a quarter of it).
  void share(std::shared_ptr<GroupRun> group);
  // A pending rank stops waiting: its completion will be called. False if the leader finished it first.
  bool defer(int32_t rank);
  const Status& status() const { return status_; }

  // The leader is done (copies included): record `status`, release the ranks still waiting on their threads and
  // hand back the completions owed to the ranks that deferred. They must be called after release() (they must not
  // touch the rendezvous).
  std::vector<Completion> finish(int32_t leader, const Status& status);

  // A rank is done with the rendezvous; the last one recycles it (a failed call's never is: its communicator is
  // finished).
  void release();
  // Increment semaphore `sem` of rank `peer` (release) and ring the call's doorbell.
  void signal(int32_t peer, int32_t sem) {
    slots_[peer].semaphores[sem].fetch_add(1, std::memory_order_release);
    bell_.ring();
  }
  Doorbell& bell() { return bell_; }

 private:
  friend class Communicator;
  void reset(int64_t run_id, uint64_t iteration);
  // Fail a call still gathering its ranks: returns the completions to call with the error (empty if the call
  // had already started or failed).
  std::vector<Completion> abort_gathering();
  std::string missing_ranks();

  enum Handoff { kWaiting = 0, kDone = 1, kDeferred = 2 };

  enum class Phase { kGathering, kRunning, kFailed };
  Communicator& owner_;
  int32_t nranks_;
  std::unique_ptr<RankSlot[]> slots_;
  Doorbell bell_;      // rung by every signal
  Doorbell finished_;  // rung when the leader has finished the call, and when it shares it
  std::shared_ptr<GroupRun> shared_;  // the running call, while the leader offers it (guarded by mu_)
  std::atomic<bool> sharing_{false};
  Status status_;
  std::atomic<int32_t> holders_{0};  // ranks not yet done with the rendezvous
  std::mutex mu_;  // guards phase_, arrived_, deadline_ and the slots' completions
  Phase phase_ = Phase::kGathering;
  int32_t arrived_ = 0;
  Clock::time_point deadline_{};
  int64_t run_id_ = 0;
  uint64_t iteration_ = 0;
};

// Something the watchdog polls while calls gather their ranks: expire() fails every call whose ranks have not all
// arrived by its deadline, handing back the completions to call with `error`; true while some call still gathers.
class WatchedCalls {
 public:
  virtual ~WatchedCalls() = default;
  virtual bool expire(Clock::time_point now, std::vector<Completion>& pending, Status& error) = 0;
};

// Register with (or leave) the watchdog; a Communicator does both itself.
void watch(WatchedCalls* g);
void unwatch(WatchedCalls* g);

class Communicator : public CallFailure, public WatchedCalls {
 public:
  explicit Communicator(int32_t nranks);
  ~Communicator() override;
  int32_t nranks() const { return nranks_; }

  // The rendezvous of this rank's next call within launch `run_id`; null if out of memory. `site` describes the
  // call site in the watchdog's messages.
  Rendezvous* join(int32_t rank, int64_t run_id, const CallSite& site);
  // The leader is done with `r` (every rank's part has run): recycle it with its scratch and staging memory.
  void recycle(Rendezvous* r);

  // Mark the communicator failed with the first failure's message and complete every rank still waiting for
  // its peers with it.
  void fail(const std::string& message) override;
  bool failed() const override { return failed_.load(std::memory_order_acquire); }
  std::string failure() const override;

  // Fail every call whose peers have not all arrived by its deadline (the watchdog calls this), handing back
  // the completions to call with `error`; true while some call is still gathering.
  bool expire(Clock::time_point now, std::vector<Completion>& pending, Status& error) override;

  // Bytes of scratch and staging memory its rendezvous hold (what it keeps between calls). Read it between calls:
  // a rank in a call grows its own slot's buffers without the communicator's lock.
  int64_t held_bytes();

 private:
  std::vector<Completion> fail_gathering(const std::string& message);

  int32_t nranks_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Rendezvous>> active_;
  std::vector<std::unique_ptr<Rendezvous>> idle_;
  std::vector<std::map<int64_t, uint64_t>> iterations_;  // per rank: run id -> calls of this site in that launch
  CallSite site_;
  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mu_;
  std::string failure_;
};

// Wake the watchdog: a rank returned pending. It then polls every 20 ms while any call is still gathering.
void watchdog_notify();

// The communicator of (callsite, group), created on first use with `nranks` slots; the caller shares its ownership
// (the compiled call's state holds it: see the top of this file). Returns null (and an error) if the key's live
// communicator has a different group size.
std::shared_ptr<Communicator> communicator_for(int64_t callsite, int32_t group, int32_t nranks, Status& status);

// What the live communicators of this process hold between calls (jaxcoll.runtime.communicator_memory).
struct CommunicatorMemory {
  int64_t communicators = 0;
  int64_t bytes = 0;  // scratch and staging
};
CommunicatorMemory communicator_memory();

}  // namespace jaxcoll
