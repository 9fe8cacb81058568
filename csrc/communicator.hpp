// Communicators: the meeting points of the ranks of one group at one call site (docs/plan-ir.md, "What the
// executor guarantees"). A Communicator is process-wide, keyed by (callsite, group), and lives as long as the
// process.
//
// XLA:CPU may run consecutive launches of a program concurrently on one device (each device admits several
// computations in flight), so "the n-th call of a rank" is not enough to pair calls: a call is identified by
// the launch's run id (shared by every device of one launch) and by how many times this rank has run the call
// site within that launch (a call site inside a loop runs once per iteration). Each such call gets its own
// Rendezvous: N slots with published buffers, semaphores and doorbells, an arrival counter for the entry
// rendezvous and the exit barrier. Finished rendezvous are recycled with their scratch and staging memory, so
// the steady state allocates nothing.
//
// A failure (timeout, bad buffer) marks the communicator failed and wakes everyone, so peers error out promptly
// instead of waiting for their own timeout; a failed communicator stays failed for the life of the process.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtype.hpp"
#include "status.hpp"
#include "wait.hpp"

namespace jaxcoll {

// Memory that grows but never shrinks: per-slot scratch and in-place staging, reused across calls.
class GrowableBuffer {
 public:
  void* reserve(size_t bytes);
  void* data() const { return data_.get(); }

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

struct RankSlot {
  Doorbell doorbell;  // rung whenever one of this rank's semaphores is signalled
  std::unique_ptr<std::atomic<uint32_t>[]> semaphores;
  int32_t nsemaphores = 0;
  RankBuffers buffers;
  std::atomic<bool> entered{false};   // arrived at entry (for error messages)
  std::atomic<bool> finished{false};  // arrived at exit
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

  // Entry rendezvous: reset this rank's semaphores (sized to `nsemaphores`), publish its buffers, wait for every
  // rank.
  Status enter(int32_t rank, int32_t nsemaphores, const RankBuffers& buffers, const CallSite& site,
               Clock::time_point deadline);
  // Exit barrier: no rank returns before every rank has finished its steps.
  Status exit(int32_t rank, const CallSite& site, Clock::time_point deadline);

  // Solo calls (small messages): one rendezvous instead of two. Every rank publishes as in enter(); the last to
  // arrive becomes the leader (`leader` set), runs every rank's lanes and calls finish_solo(); the others wait
  // in wait_solo() until it has.
  void enter_solo(int32_t rank, int32_t nsemaphores, const RankBuffers& buffers, bool& leader);
  void finish_solo();
  Status wait_solo(int32_t rank, const CallSite& site, Clock::time_point deadline);

  // Increment semaphore `sem` of rank `peer` (release) and ring its doorbell.
  void signal(int32_t peer, int32_t sem) {
    RankSlot& s = slots_[peer];
    s.semaphores[sem].fetch_add(1, std::memory_order_release);
    s.doorbell.ring();
  }
  void wake_all();

 private:
  friend class Communicator;
  void publish(int32_t rank, int32_t nsemaphores, const RankBuffers& buffers);
  Status arrive(int32_t rank, uint32_t target, const CallSite& site, Clock::time_point deadline, bool at_exit);
  void reset(int64_t run_id, uint64_t iteration);

  Communicator& owner_;
  int32_t nranks_;
  std::unique_ptr<RankSlot[]> slots_;
  Doorbell phase_;  // phase_.word counts arrivals: entry completes at N, exit at 2N
  std::atomic<int32_t> left_{0};
  int64_t run_id_ = 0;
  uint64_t iteration_ = 0;
};

class Communicator {
 public:
  explicit Communicator(int32_t nranks) : nranks_(nranks), iterations_(nranks) {}
  int32_t nranks() const { return nranks_; }

  // The rendezvous of this rank's next call within launch `run_id`; null if out of memory.
  Rendezvous* join(int32_t rank, int64_t run_id);
  // This rank is done with `r` (after its exit barrier); the last rank to leave recycles it.
  void leave(Rendezvous* r);

  // Mark the communicator failed with the first failure's message and wake every waiter.
  void fail(const std::string& message);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string failure() const;

 private:
  int32_t nranks_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Rendezvous>> active_;
  std::vector<std::unique_ptr<Rendezvous>> idle_;
  std::vector<std::map<int64_t, uint64_t>> iterations_;  // per rank: run id -> calls of this site in that launch
  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mu_;
  std::string failure_;
};

// The process-wide communicator of (callsite, group); created on first use with `nranks` slots. Returns null
// (and an error) if the key was first used with a different group size.
Communicator* communicator_for(int64_t callsite, int32_t group, int32_t nranks, Status& status);

}  // namespace jaxcoll
