#include "csrc/communicator.hpp"

#include "csrc/memory.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <thread>
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
  std::lock_guard<std::mutex> lock(mu_);
  run_id_ = run_id;
  iteration_ = iteration;
  phase_ = Phase::kGathering;
  arrived_ = 0;
  deadline_ = Clock::time_point::max();
  status_ = {};
  shared_.reset();
  sharing_.store(false, std::memory_order_relaxed);
  holders_.store(0, std::memory_order_relaxed);
  for (int32_t r = 0; r < nranks_; ++r) {
    slots_[r].arrived = false;
    slots_[r].completion = nullptr;
    slots_[r].copy_out = {};
    slots_[r].handoff.store(kWaiting, std::memory_order_relaxed);
  }
}

Rendezvous::Arrival Rendezvous::arrive(int32_t rank, int32_t nsemaphores, const RankBuffers& buffers,
                                       const CopyOut& copy_out, Completion completion, Clock::time_point deadline) {
  RankSlot& s = slots_[rank];
  // The slot's memory is this rank's until it arrives; the leader reads it after the last arrival (mu_ orders).
  if (nsemaphores > s.nsemaphores) {
    s.semaphores = std::make_unique<std::atomic<uint32_t>[]>(nsemaphores);
    s.nsemaphores = nsemaphores;
  }
  for (int32_t i = 0; i < s.nsemaphores; ++i) s.semaphores[i].store(0, std::memory_order_relaxed);
  s.buffers = buffers;
  s.copy_out = copy_out;
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_ != Phase::kGathering || owner_.failed()) return Arrival::kFailed;
  s.arrived = true;
  holders_.fetch_add(1, std::memory_order_relaxed);
  deadline_ = std::min(deadline_, deadline);
  if (++arrived_ < nranks_) {
    s.completion = std::move(completion);
    return Arrival::kPending;
  }
  phase_ = Phase::kRunning;
  return Arrival::kLeader;
}

bool Rendezvous::wait_finished(int32_t rank, Clock::time_point until, Clock::time_point deadline) {
  std::atomic<int>& h = slots_[rank].handoff;
  bool helped = false;
  for (;;) {
    const WaitResult w = wait_for(
        finished_,
        [&] {
          return h.load(std::memory_order_acquire) != kWaiting ||
                 (!helped && sharing_.load(std::memory_order_acquire));
        },
        [&] { return owner_.failed(); }, helped ? deadline : until);
    if (w != WaitResult::kReady || helped || h.load(std::memory_order_acquire) != kWaiting) break;
    helped = true;
    std::shared_ptr<GroupRun> group;
    {
      std::lock_guard<std::mutex> lock(mu_);
      group = shared_;
    }
    if (group) group->help(rank);  // returns at once if the call is over
  }
  return h.load(std::memory_order_acquire) == kDone;
}

void Rendezvous::share(std::shared_ptr<GroupRun> group) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shared_ = std::move(group);
  }
  sharing_.store(true, std::memory_order_release);
  finished_.ring();
}

bool Rendezvous::defer(int32_t rank) {
  int expected = kWaiting;
  return slots_[rank].handoff.compare_exchange_strong(expected, kDeferred, std::memory_order_acq_rel);
}

std::vector<Completion> Rendezvous::finish(int32_t leader, const Status& status) {
  status_ = status;
  std::vector<Completion> owed;
  bool woke = false;
  std::lock_guard<std::mutex> lock(mu_);
  shared_.reset();  // it refers to the leader's frame
  for (int32_t r = 0; r < nranks_; ++r) {
    RankSlot& s = slots_[r];
    if (r == leader || !s.completion) continue;  // no completion: it was called already (abort_gathering)
    int expected = kWaiting;
    if (s.handoff.compare_exchange_strong(expected, kDone, std::memory_order_acq_rel)) {
      s.completion = nullptr;  // finished on its own thread
      woke = true;
    } else {
      owed.push_back(std::move(s.completion));
    }
  }
  if (woke) finished_.ring();
  return owed;
}

void Rendezvous::release() {
  if (holders_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (phase_ == Phase::kRunning && status_.ok()) owner_.recycle(this);
}

std::vector<Completion> Rendezvous::abort_gathering() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Completion> out;
  if (phase_ != Phase::kGathering) return out;
  phase_ = Phase::kFailed;
  for (int32_t r = 0; r < nranks_; ++r)
    if (slots_[r].completion) out.push_back(std::move(slots_[r].completion));
  return out;
}

std::string Rendezvous::missing_ranks() {
  std::string missing;
  for (int32_t r = 0; r < nranks_; ++r)
    if (!slots_[r].arrived) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  return missing;
}

// ---- Communicator ----------------------------------------------------------------------------------------------

namespace {

// Every live communicator, for the watchdog.
struct Watchdog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<WatchedCalls*> comms;
  bool poked = false;
  std::thread thread;

  Watchdog() {
    thread = std::thread([this] { loop(); });
    thread.detach();  // lives as long as the process; never joined at exit
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    bool gathering = false;
    for (;;) {
      if (gathering)
        cv.wait_for(lock, std::chrono::milliseconds(20));
      else
        cv.wait(lock, [&] { return poked; });
      poked = false;
      gathering = false;
      const auto now = Clock::now();
      // Completions run outside the lock: they may start XLA's continuation of a program, which can call into
      // jaxcoll again (and create communicators, which takes this lock).
      std::vector<std::pair<std::vector<Completion>, Status>> failed;
      for (WatchedCalls* c : comms) {
        std::vector<Completion> pending;
        Status error;
        gathering |= c->expire(now, pending, error);
        if (!pending.empty()) failed.emplace_back(std::move(pending), error);
      }
      lock.unlock();
      for (auto& [pending, error] : failed)
        for (Completion& c : pending) c(error);
      lock.lock();
    }
  }
};

Watchdog& watchdog() {
  static Watchdog* w = new Watchdog();  // leaked on purpose: its thread outlives static destruction
  return *w;
}

}  // namespace

void watchdog_notify() {
  Watchdog& w = watchdog();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.poked = true;
  }
  w.cv.notify_one();
}

void watch(WatchedCalls* g) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mu);
  w.comms.push_back(g);
}

void unwatch(WatchedCalls* g) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mu);
  w.comms.erase(std::remove(w.comms.begin(), w.comms.end(), g), w.comms.end());
}

Communicator::Communicator(int32_t nranks) : nranks_(nranks), iterations_(nranks) { watch(this); }

Communicator::~Communicator() { unwatch(this); }

Rendezvous* Communicator::join(int32_t rank, int64_t run_id, const CallSite& site) {
  std::lock_guard<std::mutex> lock(mu_);
  site_ = site;
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

void Communicator::recycle(Rendezvous* r) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < active_.size(); ++i) {
    if (active_[i].get() != r) continue;
    idle_.push_back(std::move(active_[i]));
    active_[i] = std::move(active_.back());
    active_.pop_back();
    return;
  }
}

std::vector<Completion> Communicator::fail_gathering(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (failure_.empty()) failure_ = message;
  }
  failed_.store(true, std::memory_order_release);
  std::vector<Completion> pending;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : active_) {
    for (Completion& c : r->abort_gathering()) pending.push_back(std::move(c));
    r->bell_.ring();  // a leader waiting for a signal notices the failure at once
  }
  return pending;
}

void Communicator::fail(const std::string& message) {
  std::vector<Completion> pending = fail_gathering(message);
  const Status err = Status::Error(failure());
  for (Completion& c : pending) c(err);  // last: a completion may let the owner of this communicator destroy it
}

bool Communicator::expire(Clock::time_point now, std::vector<Completion>& pending, Status& error) {
  std::string message;
  bool gathering = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : active_) {
      std::lock_guard<std::mutex> rl(r->mu_);
      if (r->phase_ != Rendezvous::Phase::kGathering || r->arrived_ == 0) continue;
      if (now < r->deadline_) {
        gathering = true;
        continue;
      }
      message = site_.describe() + ": timed out waiting for every rank to arrive (launch " +
                std::to_string(r->run_id_) + ", call " + std::to_string(r->iteration_) +
                " of this site in it); ranks that never arrived: [" + r->missing_ranks() +
                "] (timeout set by JAXCOLL_TIMEOUT; a rank that never arrives usually ran a different program or "
                "failed before this collective)";
      break;
    }
  }
  if (!message.empty()) {
    pending = fail_gathering(message);
    error = Status::Error(failure());
  }
  return gathering;
}

std::string Communicator::failure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

int64_t Communicator::held_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t bytes = 0;
  for (const auto* list : {&active_, &idle_})
    for (const auto& r : *list)
      for (int32_t i = 0; i < r->nranks_; ++i)
        bytes += int64_t(r->slots_[i].scratch.size() + r->slots_[i].staging.size());
  return bytes;
}

namespace {

// Every live communicator, by (callsite, group). It finds them and owns none: their compiled calls do.
struct Registry {
  std::mutex mu;
  std::map<std::pair<int64_t, int32_t>, std::weak_ptr<Communicator>> comms;
};

Registry& registry() {
  static Registry* r = new Registry();  // outlives the watchdog and every compiled call at exit
  return *r;
}

}  // namespace

std::shared_ptr<Communicator> communicator_for(int64_t callsite, int32_t group, int32_t nranks, Status& status) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::erase_if(reg.comms, [](const auto& entry) { return entry.second.expired(); });
  std::weak_ptr<Communicator>& entry = reg.comms[{callsite, group}];
  std::shared_ptr<Communicator> c = entry.lock();
  if (!c) {
    c = std::make_shared<Communicator>(nranks);
    entry = c;
  }
  if (c->nranks() != nranks) {
    status = Status::Error("jaxcoll callsite " + std::to_string(callsite) + ", group " + std::to_string(group) +
                           ": plan for " + std::to_string(nranks) + " ranks, but this call site first ran with " +
                           std::to_string(c->nranks()) + " ranks; every lowered call site needs its own callsite id");
    return nullptr;
  }
  return c;
}

CommunicatorMemory communicator_memory() {
  std::vector<std::shared_ptr<Communicator>> live;
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    for (const auto& [key, weak] : reg.comms)
      if (auto c = weak.lock()) live.push_back(std::move(c));
  }
  CommunicatorMemory m;
  for (const auto& c : live) {
    ++m.communicators;
    m.bytes += c->held_bytes();
  }
  return m;
}

}  // namespace jaxcoll
