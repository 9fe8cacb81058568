#include "communicator.hpp"

#include "memory.hpp"

#include <cstdlib>
#include <utility>

namespace jaxcoll {

void GrowableBuffer::Free::operator()(void* p) const { std::free(p); }

void* GrowableBuffer::reserve(size_t bytes) {
  if (bytes > size_) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (!p) return nullptr;
    advise_huge_pages(p, rounded);
    data_.reset(p);
    size_ = rounded;
  }
  return data_.get();
}

std::string CallSite::describe() const {
  return std::string("jaxcoll ") + collective + " (callsite " + std::to_string(callsite) + ", group " +
         std::to_string(group) + ")";
}

// ---- Rendezvous ------------------------------------------------------------------------------------------------

Rendezvous::Rendezvous(Communicator& owner, int32_t nranks)
    : owner_(owner), nranks_(nranks), slots_(std::make_unique<RankSlot[]>(nranks)) {}

void Rendezvous::reset(int64_t run_id, uint64_t iteration) {
  run_id_ = run_id;
  iteration_ = iteration;
  phase_.word.store(0, std::memory_order_relaxed);
  left_.store(0, std::memory_order_relaxed);
  for (int32_t r = 0; r < nranks_; ++r) {
    slots_[r].entered.store(false, std::memory_order_relaxed);
    slots_[r].finished.store(false, std::memory_order_relaxed);
  }
}

void Rendezvous::wake_all() {
  phase_.word.fetch_add(0, std::memory_order_seq_cst);
  futex_wake_all(phase_.word);
  for (int32_t r = 0; r < nranks_; ++r) {
    slots_[r].doorbell.word.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(slots_[r].doorbell.word);
  }
}

Status Rendezvous::arrive(int32_t rank, uint32_t target, const CallSite& site, Clock::time_point deadline,
                          bool at_exit) {
  const uint32_t after = phase_.word.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (after == target) {  // the last to arrive releases the others
    if (phase_.sleepers.load(std::memory_order_seq_cst)) futex_wake_all(phase_.word);
    return {};
  }
  auto reached = [&] { return phase_.word.load(std::memory_order_acquire) >= target; };
  const WaitResult w = wait_for(phase_, reached, [&] { return owner_.failed(); }, deadline);
  if (w == WaitResult::kReady) return {};
  if (w == WaitResult::kAborted) return Status::Error(site.describe() + ": " + owner_.failure());
  std::string missing;
  for (int32_t r = 0; r < nranks_; ++r) {
    const bool seen = at_exit ? slots_[r].finished.load() : slots_[r].entered.load();
    if (!seen) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  Status err = Status::Error(
      site.describe() + ": rank " + std::to_string(rank) + " timed out in the " + (at_exit ? "exit" : "entry") +
      " rendezvous (launch " + std::to_string(run_id_) + ", call " + std::to_string(iteration_) +
      " of this site in it); ranks that never arrived: [" + missing +
      "] (timeout set by JAXCOLL_TIMEOUT; a rank that never arrives usually ran a different program or "
      "deadlocked on another collective)");
  owner_.fail(err.message());
  return err;
}

void Rendezvous::publish(int32_t rank, int32_t nsemaphores, const RankBuffers& buffers) {
  RankSlot& s = slots_[rank];
  // Peers touch these only after the entry rendezvous.
  if (nsemaphores > s.nsemaphores) {
    s.semaphores = std::make_unique<std::atomic<uint32_t>[]>(nsemaphores);
    s.nsemaphores = nsemaphores;
  }
  for (int32_t i = 0; i < s.nsemaphores; ++i) s.semaphores[i].store(0, std::memory_order_relaxed);
  s.buffers = buffers;
  s.entered.store(true, std::memory_order_relaxed);
}

Status Rendezvous::enter(int32_t rank, int32_t nsemaphores, const RankBuffers& buffers, const CallSite& site,
                         Clock::time_point deadline) {
  publish(rank, nsemaphores, buffers);
  return arrive(rank, static_cast<uint32_t>(nranks_), site, deadline, false);
}

void Rendezvous::enter_solo(int32_t rank, int32_t nsemaphores, const RankBuffers& buffers, bool& leader) {
  publish(rank, nsemaphores, buffers);
  leader = phase_.word.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(nranks_);
}

void Rendezvous::finish_solo() {
  for (int32_t r = 0; r < nranks_; ++r) slots_[r].finished.store(true, std::memory_order_relaxed);
  phase_.word.store(static_cast<uint32_t>(2 * nranks_), std::memory_order_seq_cst);
  if (phase_.sleepers.load(std::memory_order_seq_cst)) futex_wake_all(phase_.word);
}

Status Rendezvous::wait_solo(int32_t rank, const CallSite& site, Clock::time_point deadline) {
  const uint32_t target = static_cast<uint32_t>(2 * nranks_);
  auto reached = [&] { return phase_.word.load(std::memory_order_acquire) >= target; };
  const WaitResult w = wait_for(phase_, reached, [&] { return owner_.failed(); }, deadline);
  if (w == WaitResult::kReady) return {};
  if (w == WaitResult::kAborted) return Status::Error(site.describe() + ": " + owner_.failure());
  std::string missing;
  for (int32_t r = 0; r < nranks_; ++r)
    if (!slots_[r].entered.load()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  Status err = Status::Error(
      site.describe() + ": rank " + std::to_string(rank) + " timed out waiting for the call (launch " +
      std::to_string(run_id_) + ", call " + std::to_string(iteration_) + " of this site in it); ranks that never " +
      "arrived: [" + missing + "] (timeout set by JAXCOLL_TIMEOUT; a rank that never arrives usually ran a "
      "different program or deadlocked on another collective)");
  owner_.fail(err.message());
  return err;
}

Status Rendezvous::exit(int32_t rank, const CallSite& site, Clock::time_point deadline) {
  slots_[rank].finished.store(true, std::memory_order_relaxed);
  return arrive(rank, static_cast<uint32_t>(2 * nranks_), site, deadline, true);
}

// ---- Communicator ----------------------------------------------------------------------------------------------

Rendezvous* Communicator::join(int32_t rank, int64_t run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& iters = iterations_[rank];
  const uint64_t iteration = ++iters[run_id];
  if (iters.size() > 64) iters.erase(iters.begin());  // run ids grow: forget the oldest launch
  for (auto& r : active_)
    if (r->run_id_ == run_id && r->iteration_ == iteration) return r.get();
  std::unique_ptr<Rendezvous> r;
  if (!idle_.empty()) {
    r = std::move(idle_.back());
    idle_.pop_back();
  } else {
    r = std::make_unique<Rendezvous>(*this, nranks_);
  }
  r->reset(run_id, iteration);
  active_.push_back(std::move(r));
  return active_.back().get();
}

void Communicator::leave(Rendezvous* r) {
  if (r->left_.fetch_add(1, std::memory_order_acq_rel) + 1 != nranks_) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < active_.size(); ++i) {
    if (active_[i].get() != r) continue;
    idle_.push_back(std::move(active_[i]));
    active_[i] = std::move(active_.back());
    active_.pop_back();
    return;
  }
}

void Communicator::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (failure_.empty()) failure_ = message;
  }
  failed_.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : active_) r->wake_all();
}

std::string Communicator::failure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
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
