#include "communicator.hpp"

#include <cstdlib>
#include <map>
#include <utility>

namespace jaxcoll {

void GrowableBuffer::Free::operator()(void* p) const { std::free(p); }

void* GrowableBuffer::reserve(size_t bytes) {
  if (bytes > size_) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (!p) return nullptr;
    data_.reset(p);
    size_ = rounded;
  }
  return data_.get();
}

std::string CallSite::describe() const {
  return std::string("jaxcoll ") + collective + " (callsite " + std::to_string(callsite) + ", group " +
         std::to_string(group) + ")";
}

Communicator::Communicator(int32_t nranks) : nranks_(nranks), slots_(std::make_unique<RankSlot[]>(nranks)) {}

void Communicator::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (failure_.empty()) failure_ = message;
  }
  failed_.store(true, std::memory_order_release);
  phase_.word.fetch_add(0, std::memory_order_seq_cst);
  futex_wake_all(phase_.word);
  for (int32_t r = 0; r < nranks_; ++r) {
    slots_[r].doorbell.word.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(slots_[r].doorbell.word);
  }
}

std::string Communicator::failure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

Status Communicator::arrive(int32_t rank, uint32_t target, const CallSite& site, Clock::time_point deadline,
                            bool at_exit, uint64_t call) {
  const uint32_t after = phase_.word.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (after == target) {  // the last to arrive releases the others
    if (phase_.sleepers.load(std::memory_order_seq_cst)) futex_wake_all(phase_.word);
    return {};
  }
  auto reached = [&] {
    return static_cast<int32_t>(phase_.word.load(std::memory_order_acquire) - target) >= 0;
  };
  const WaitResult w = wait_for(phase_, reached, [&] { return failed(); }, deadline);
  if (w == WaitResult::kReady) return {};
  if (w == WaitResult::kAborted) return Status::Error(site.describe() + ": " + failure());
  std::string missing;
  for (int32_t r = 0; r < nranks_; ++r) {
    const uint64_t seen = at_exit ? slots_[r].finished.load() : slots_[r].entered.load();
    if (seen < call) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  Status err = Status::Error(
      site.describe() + ": rank " + std::to_string(rank) + " timed out in the " + (at_exit ? "exit" : "entry") +
      " rendezvous of call " + std::to_string(call) + "; ranks that never arrived: [" + missing +
      "] (timeout set by JAXCOLL_TIMEOUT; a rank that never arrives usually ran a different program or "
      "deadlocked on another collective)");
  fail(err.message());
  return err;
}

Status Communicator::enter(int32_t rank, int32_t nsemaphores, const RankBuffers& buffers, const CallSite& site,
                           Clock::time_point deadline, uint64_t& call) {
  if (failed())
    return Status::Error(site.describe() + ": an earlier call of this collective failed and left its peers in an "
                         "unknown state; restart the process. The failure was: " + failure());
  RankSlot& s = slots_[rank];
  // Peers touch these only after the rendezvous below, and every peer has finished the previous call.
  if (nsemaphores > s.nsemaphores) {
    s.semaphores = std::make_unique<std::atomic<uint32_t>[]>(nsemaphores);
    s.nsemaphores = nsemaphores;
  }
  for (int32_t i = 0; i < s.nsemaphores; ++i) s.semaphores[i].store(0, std::memory_order_relaxed);
  s.buffers = buffers;
  call = ++s.calls;
  s.entered.store(call, std::memory_order_relaxed);
  const uint32_t target = static_cast<uint32_t>((2 * call - 1) * static_cast<uint64_t>(nranks_));
  return arrive(rank, target, site, deadline, false, call);
}

Status Communicator::exit(int32_t rank, uint64_t call, const CallSite& site, Clock::time_point deadline) {
  slots_[rank].finished.store(call, std::memory_order_relaxed);
  const uint32_t target = static_cast<uint32_t>(2 * call * static_cast<uint64_t>(nranks_));
  return arrive(rank, target, site, deadline, true, call);
}

Communicator* communicator_for(int64_t callsite, int32_t group, int32_t nranks, Status& status) {
  static std::mutex mu;
  static std::map<std::pair<int64_t, int32_t>, std::unique_ptr<Communicator>> registry;
  std::lock_guard<std::mutex> lock(mu);
  auto& c = registry[{callsite, group}];
  if (!c) c = std::make_unique<Communicator>(nranks);
  if (c->nranks() != nranks) {
    status = Status::Error("jaxcoll callsite " + std::to_string(callsite) + ", group " + std::to_string(group) +
                           ": plan for " + std::to_string(nranks) + " ranks, but this call site first ran with " +
                           std::to_string(c->nranks()) + " ranks; every lowered call site needs its own callsite id");
    return nullptr;
  }
  return c.get();
}

}  // namespace jaxcoll
