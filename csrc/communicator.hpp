// A communicator: the meeting point of the ranks of one group at one call site (docs/plan-ir.md, "What the
// executor guarantees"). It is process-wide, keyed by (callsite, group), and lives as long as the process, so
// its scratch, staging buffers and semaphores are reused by every call.
//
// One phase counter orders everything: the n-th call of a rank arrives at entry when the counter reaches
// (2n-1)*N and at exit when it reaches 2n*N. A rank cannot start call n+1 before every rank has arrived at the
// exit of call n, so the n-th call on a rank always meets the n-th call on its peers, whatever the order in
// which XLA runs different call sites. A failure (timeout, bad buffer) marks the communicator failed and wakes
// everyone, so peers error out promptly instead of waiting for their own timeout; a failed communicator stays
// failed for the life of the process.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

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
  uint64_t calls = 0;                  // calls started by this rank (owned by its thread)
  std::atomic<uint64_t> entered{0};    // last call that arrived at entry (for error messages)
  std::atomic<uint64_t> finished{0};   // last call that arrived at exit
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

class Communicator {
 public:
  explicit Communicator(int32_t nranks);
  int32_t nranks() const { return nranks_; }
  RankSlot& slot(int32_t rank) { return slots_[rank]; }

  // Entry rendezvous: reset this rank's semaphores (sized to `nsemaphores`), publish its buffers, wait for every
  // rank. On success `call` is this rank's call number (1-based).
  Status enter(int32_t rank, int32_t nsemaphores, const RankBuffers& buffers, const CallSite& site,
               Clock::time_point deadline, uint64_t& call);
  // Exit barrier: no rank returns before every rank has finished call `call`'s steps.
  Status exit(int32_t rank, uint64_t call, const CallSite& site, Clock::time_point deadline);

  // Increment semaphore `sem` of rank `peer` (release) and ring its doorbell.
  void signal(int32_t peer, int32_t sem) {
    RankSlot& s = slots_[peer];
    s.semaphores[sem].fetch_add(1, std::memory_order_release);
    s.doorbell.ring();
  }

  // Mark the communicator failed with the first failure's message and wake every waiter.
  void fail(const std::string& message);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string failure() const;

 private:
  Status arrive(int32_t rank, uint32_t target, const CallSite& site, Clock::time_point deadline, bool at_exit,
                uint64_t call);

  int32_t nranks_;
  std::unique_ptr<RankSlot[]> slots_;
  Doorbell phase_;  // phase_.word is the phase counter itself
  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mu_;
  std::string failure_;
};

// The process-wide communicator of (callsite, group); created on first use with `nranks` slots. Returns null
// (and an error) if the key was first used with a different group size.
Communicator* communicator_for(int64_t callsite, int32_t group, int32_t nranks, Status& status);

}  // namespace jaxcoll
