#include "executor.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "layout.hpp"
#include "memory.hpp"
#include "reduce.hpp"

namespace jaxcoll {

namespace {
std::atomic<int64_t> solo_limit{[] {
  const char* v = std::getenv("JAXCOLL_SOLO_BYTES");
  return v && *v ? std::strtoll(v, nullptr, 10) : int64_t{4} << 20;
}()};
}  // namespace

int64_t solo_bytes() { return solo_limit.load(std::memory_order_relaxed); }
void set_solo_bytes(int64_t bytes) { solo_limit.store(bytes, std::memory_order_relaxed); }

double default_timeout_s() {
  static const double t = [] {
    const char* v = std::getenv("JAXCOLL_TIMEOUT");
    if (!v || !*v) return 300.0;
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    return (end && *end == '\0' && x > 0) ? x : 300.0;
  }();
  return t;
}

namespace {

// Bytes every rank's data steps of one call read and write together, for blocks of `block` elements.
int64_t call_traffic_bytes(const Plan& plan, int64_t block, DType dtype) {
  return plan.traffic_chunks * block / plan.chunk_factor * int64_t(dtype_size(dtype));
}

// A small array on the stack, on the heap only when a plan is unusually wide.
template <class T, size_t N>
class SmallVec {
 public:
  explicit SmallVec(size_t n) : n_(n) {
    if (n > N) heap_.resize(n);
  }
  T* data() { return n_ > N ? heap_.data() : stack_; }
  T& operator[](size_t i) { return data()[i]; }

 private:
  size_t n_;
  T stack_[N]{};
  std::vector<T> heap_;
};

struct LaneState {
  int32_t pc = 0;
  int32_t barriers = 0;     // barriers this lane has arrived at
  bool at_barrier = false;  // arrived at its current barrier, not yet released
  bool done = false;
};

class RankRun {
 public:
  RankRun(Rendezvous& rv, const Plan& plan, int32_t rank, const CallBuffers& b, const CallSite& site, int64_t block)
      : rv_(rv), comm_(rv.owner()), plan_(plan), rank_(rank), prog_(plan.ranks[rank]), b_(b), site_(site),
        k_(plan.chunk_factor), dsize_(dtype_size(b.dtype)), asize_(accum_size(b.dtype)),
        block_(block),
        stream_(stream_call(call_traffic_bytes(plan, block, b.dtype))),
        lanes_(prog_.nlanes), consumed_(prog_.semaphores) {
    for (int32_t l = 0; l < prog_.nlanes; ++l) {
      lanes_[l].done = plan_.lanes[prog_.first_lane + l].nsteps == 0;
      live_ += !lanes_[l].done;
    }
  }

  bool done() const { return live_ == 0; }

  // Run every lane until it blocks on an unsatisfied wait or barrier; true if any step ran.
  bool advance() {
    const int32_t nlanes = prog_.nlanes;
    RankSlot& me = rv_.slot(rank_);
    bool progressed = false;
    for (int32_t l = 0; l < nlanes; ++l) {
      LaneState& ls = lanes_[l];
      const Lane& lane = plan_.lanes[prog_.first_lane + l];
      while (!ls.done) {
        const Step& s = plan_.steps[lane.first_step + ls.pc];
        if (s.op == Op::kWait) {
          if (me.semaphores[s.sem].load(std::memory_order_acquire) <= consumed_[s.sem]) break;
          ++consumed_[s.sem];
        } else if (s.op == Op::kBarrier) {
          if (!ls.at_barrier) {
            ls.at_barrier = true;
            ++ls.barriers;
            progressed = true;
          }
          bool all = true;
          for (int32_t o = 0; o < nlanes && all; ++o) all = lanes_[o].done || lanes_[o].barriers >= ls.barriers;
          if (!all) break;
          ls.at_barrier = false;
        } else if (s.op == Op::kSignal) {
          rv_.signal(s.peer, s.sem);
        } else {
          data_step(s);
        }
        progressed = true;
        if (++ls.pc == lane.nsteps) {
          ls.done = true;
          --live_;
        }
      }
    }
    return progressed;
  }

  // Some lane is blocked on a wait (not a barrier): the state a deadlock or timeout reports.
  bool waiting() {
    for (int32_t l = 0; l < prog_.nlanes; ++l) {
      if (lanes_[l].done) continue;
      if (plan_.steps[plan_.lanes[prog_.first_lane + l].first_step + lanes_[l].pc].op == Op::kWait) return true;
    }
    return false;
  }

  // What every blocked wait of this rank is waiting for, and who should signal it (marks the call failed).
  Status blocked_error(const std::string& why) {
    LaneState* lanes = lanes_.data();
    const uint32_t* consumed = consumed_.data();
    std::string what;
    RankSlot& me = rv_.slot(rank_);
    for (int32_t l = 0; l < prog_.nlanes; ++l) {
      if (lanes[l].done) continue;
      const Step& s = plan_.steps[plan_.lanes[prog_.first_lane + l].first_step + lanes[l].pc];
      if (s.op != Op::kWait) continue;
      std::string signallers;
      for (int32_t r = 0; r < plan_.nranks; ++r) {
        const RankProgram& p = plan_.ranks[r];
        bool sends = false;
        for (int32_t q = 0; q < p.nlanes && !sends; ++q) {
          const Lane& ln = plan_.lanes[p.first_lane + q];
          for (int32_t i = 0; i < ln.nsteps && !sends; ++i) {
            const Step& t = plan_.steps[ln.first_step + i];
            sends = t.op == Op::kSignal && t.peer == rank_ && t.sem == s.sem;
          }
        }
        if (sends) signallers += (signallers.empty() ? "" : ", ") + std::to_string(r);
      }
      what += (what.empty() ? "" : "; ") + plan_.where(rank_, l, lanes[l].pc) + " waits on semaphore " +
              std::to_string(s.sem) + ", which received " +
              std::to_string(me.semaphores[s.sem].load()) + " signal(s) and needs " +
              std::to_string(consumed[s.sem] + 1) + " (ranks whose plan signals it: [" + signallers + "])";
    }
    Status err = Status::Error(site_.describe() + ": rank " + std::to_string(rank_) + " " + why + what +
                               " (timeout set by JAXCOLL_TIMEOUT; the plan may deadlock: check it with "
                               "jaxcoll.lang's checker)");
    comm_.fail(err.message());
    return err;
  }

 private:
  void* base(const ChunkRef& ref) {
    const RankBuffers& rb = rv_.slot(ref.rank).buffers;
    switch (ref.buffer) {
      case BufferKind::kInput: return rb.input;
      case BufferKind::kOutput: return rb.output;
      case BufferKind::kScratch: return rb.scratch;
    }
    return nullptr;
  }

  void data_step(const Step& s) {
    const ChunkRef* refs = plan_.srcs(s);
    const int32_t nref = s.nsrc + s.ndst;
    const ElementRange range = chunk_range(k_, block_, refs[0].index, refs[0].count);
    if (range.size() == 0) return;
    SmallVec<Operand, 24> ops(nref);
    for (int32_t j = 0; j < nref; ++j) {
      const ChunkRef& ref = refs[j];
      const bool accum = ref.buffer == BufferKind::kScratch;
      const int64_t start = chunk_start(k_, block_, ref.index);
      ops[j] = {static_cast<char*>(base(ref)) + start * int64_t(accum ? asize_ : dsize_), accum};
    }
    reduce_chunks(b_.dtype, b_.op, ops.data(), s.nsrc, ops.data() + s.nsrc, s.ndst, range.size(), stream_);
  }


 private:
  Rendezvous& rv_;
  Communicator& comm_;
  const Plan& plan_;
  int32_t rank_;
  const RankProgram& prog_;
  const CallBuffers& b_;
  const CallSite& site_;
  int64_t k_;
  size_t dsize_, asize_;
  int64_t block_;
  bool stream_;  // the call moves enough to stream its large destinations past the caches
  SmallVec<LaneState, 16> lanes_;
  SmallVec<uint32_t, 32> consumed_;
  int32_t live_ = 0;
};

Status fail_with(Communicator& comm, const CallSite& site, int32_t rank, const std::string& what) {
  Status err = Status::Error(site.describe() + ": rank " + std::to_string(rank) + ": " + what);
  comm.fail(err.message());
  return err;
}

// Every rank of a call must pass the same block size and element type (peers address each other's buffers).
Status check_peers(Rendezvous& rv, const Plan& plan, int32_t rank, int64_t block, DType dtype, const CallSite& site) {
  for (int32_t r = 0; r < plan.nranks; ++r) {
    const RankBuffers& peer = rv.slot(r).buffers;
    if (peer.block != block || peer.dtype != dtype)
      return fail_with(rv.owner(), site, rank, "rank " + std::to_string(r) + " called with " +
                                                   std::to_string(peer.block) + "-element blocks of " +
                                                   dtype_name(peer.dtype) + ", this rank with " +
                                                   std::to_string(block) + " of " + dtype_name(dtype) +
                                                   "; every rank must pass the same shape");
  }
  return {};
}

// Small calls are run by the leader alone: waking helpers costs more than the data moves. "Small" counts every
// byte the call reads and writes, so an all_gather (N^2 S bytes written) gets help sooner than an all_reduce
// (2 N S bytes) of the same input size. JAXCOLL_SOLO_BYTES overrides.
bool solo_call(const Plan& plan, const CallBuffers& b) {
  return plan.nranks == 1 || call_traffic_bytes(plan, b.input_elements / plan.in_blocks, b.dtype) <= solo_bytes();
}

// Every rank's lanes of one call, run by the leader and by any helpers that join. A rank is the unit of work:
// whoever claims it advances its lanes until they block, then releases it (its lanes share semaphore counts, so
// one thread at a time). A helper that starts late, or never, only costs parallelism: the leader alone can always
// finish the call.
class GroupRun {
 public:
  GroupRun(Rendezvous& rv, const Plan& plan, const CallBuffers& b, const CallSite& site, Clock::time_point deadline,
           int64_t block)
      : rv_(rv), comm_(rv.owner()), claimed_(std::make_unique<std::atomic<bool>[]>(plan.nranks)),
        deadline_(deadline) {
    runs_.reserve(plan.nranks);
    for (int32_t r = 0; r < plan.nranks; ++r) {
      runs_.emplace_back(rv, plan, r, b, site, block);
      remaining_ += !runs_.back().done();
    }
  }

  // A helper's whole part: claim ranks until the call is done, sleeping on the call's doorbell while every rank
  // it could claim is blocked.
  void help(int32_t start) {
    active_.fetch_add(1, std::memory_order_seq_cst);
    while (!closed_.load(std::memory_order_seq_cst) && remaining_.load(std::memory_order_acquire) > 0 &&
           !comm_.failed()) {
      const uint32_t seen = rv_.bell().word.load(std::memory_order_seq_cst);
      if (pass(start)) continue;
      if (wait_for(rv_.bell(), [&] { return changed(seen); }, [&] { return comm_.failed(); }, deadline_) !=
          WaitResult::kReady)
        break;
    }
    active_.fetch_sub(1, std::memory_order_seq_cst);
    left_.ring();  // the group's own bell: the rendezvous may be recycled by now
  }

  // The leader's part: run until every rank is done, then wait for the helpers inside to leave.
  Status lead() {
    Status st = drive();
    closed_.store(true, std::memory_order_seq_cst);
    rv_.bell().ring();  // wakes helpers sleeping on a signal
    wait_for(left_, [&] { return active_.load(std::memory_order_seq_cst) == 0; }, [] { return false; },
             Clock::time_point::max());
    return st;
  }

 private:
  bool changed(uint32_t seen) const {
    return rv_.bell().word.load(std::memory_order_seq_cst) != seen || closed_.load(std::memory_order_seq_cst) ||
           remaining_.load(std::memory_order_acquire) == 0;
  }

  // One pass over the ranks nobody else holds; true if any step ran.
  bool pass(int32_t start) {
    bool progressed = false;
    const int32_t n = static_cast<int32_t>(runs_.size());
    busy_.fetch_add(1, std::memory_order_seq_cst);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t r = (start + i) % n;
      if (claimed_[r].exchange(true, std::memory_order_acquire)) continue;
      RankRun& run = runs_[r];
      if (!run.done() && run.advance()) {
        progressed = true;
        if (run.done()) remaining_.fetch_sub(1, std::memory_order_acq_rel);
      }
      claimed_[r].store(false, std::memory_order_release);
    }
    if (progressed) epoch_.fetch_add(1, std::memory_order_seq_cst);
    busy_.fetch_sub(1, std::memory_order_seq_cst);
    if (progressed && active_.load(std::memory_order_relaxed) > 0) rv_.bell().ring();  // others may now move
    return progressed;
  }

  Status drive() {
    while (remaining_.load(std::memory_order_acquire) > 0) {
      if (comm_.failed()) return Status::Error(comm_.failure());
      const uint32_t seen = rv_.bell().word.load(std::memory_order_seq_cst);
      const uint64_t epoch = epoch_.load(std::memory_order_seq_cst);
      if (pass(0)) continue;
      // Nothing moved in a full pass while nobody else was working: every lane of every rank is blocked.
      if (busy_.load(std::memory_order_seq_cst) == 0 && epoch_.load(std::memory_order_seq_cst) == epoch)
        return blocked("deadlocks: every lane of every rank is blocked, so a semaphore is never signalled: ",
                       "jaxcoll: every lane of every rank is blocked at a barrier (malformed plan)");
      const WaitResult w = wait_for(rv_.bell(), [&] { return changed(seen); }, [&] { return comm_.failed(); },
                                    deadline_);
      if (w == WaitResult::kAborted) return Status::Error(comm_.failure());
      if (w == WaitResult::kTimeout)
        return blocked("timed out: the semaphore was never signalled: ",
                       "jaxcoll: timed out with every lane blocked at a barrier");
    }
    return {};
  }

  // The error of a call that cannot move: the first rank blocked on a wait explains it, else every lane is
  // stuck at a barrier.
  Status blocked(const std::string& why, const std::string& at_barrier) {
    for (RankRun& run : runs_)
      if (!run.done() && run.waiting()) return run.blocked_error(why);
    return Status::Error(at_barrier);
  }

  Rendezvous& rv_;
  Communicator& comm_;
  std::vector<RankRun> runs_;
  std::unique_ptr<std::atomic<bool>[]> claimed_;
  std::atomic<int32_t> remaining_{0};
  std::atomic<int32_t> active_{0};  // helpers inside help()
  std::atomic<int32_t> busy_{0};    // threads inside pass()
  std::atomic<uint64_t> epoch_{0};  // passes that moved something
  std::atomic<bool> closed_{false};
  Doorbell left_;  // rung by each helper as it leaves
  const Clock::time_point deadline_;
};

// The leader: run the call for every rank, settle the copies owed, recycle the rendezvous and complete the ranks
// that arrived first (through the helpers' scheduler, so their programs continue in parallel).
Status lead_call(Communicator& comm, Rendezvous* rv, const Plan& plan, int32_t rank, const CallBuffers& b,
                 const CallSite& site, Clock::time_point deadline, int64_t block, const Helpers& helpers) {
  Status st = check_peers(*rv, plan, rank, block, b.dtype, site);
  if (st.ok()) {
    auto group = std::make_shared<GroupRun>(*rv, plan, b, site, deadline, block);
    if (!solo_call(plan, b) && helpers.schedule) {
      const int n = std::min<int>(helpers.count, plan.nranks - 1);
      for (int h = 0; h < n; ++h)
        helpers.schedule([group, start = (h + 1) * plan.nranks / (n + 1)] { group->help(start); });
    }
    st = group->lead();
    if (!st.ok()) comm.fail(st.message());
  }
  if (st.ok()) {
    for (int32_t r = 0; r < plan.nranks; ++r) {
      const CopyOut& c = rv->slot(r).copy_out;
      if (c.bytes) std::memcpy(c.dst, c.src, c.bytes);
    }
  }
  // Ranks still waiting on their own threads continue there; the completions of those that gave up waiting go
  // through the pool, so their programs continue in parallel (never one after another on this thread: a
  // continuation may block in one of XLA's own collectives, waiting for the others).
  std::vector<Completion> owed = rv->finish(rank, st);
  rv->release();
  for (Completion& c : owed) {
    if (helpers.schedule)
      helpers.schedule([c = std::move(c), st] { c(st); });
    else
      c(st);
  }
  return st;
}

// How long a rank that arrives before the last waits on its own thread for the call to finish before it
// returns pending (JAXCOLL_SYNC_WAIT_US, default 2000). Finishing on its own thread saves the hop through a pool
// thread that a completion costs (64 KiB all_reduce in a loop: 0.18 ms per call through the pool); the bound
// keeps a waiting thread from ever being what a peer's call is queued behind.
Clock::duration sync_wait() {
  static const Clock::duration d = [] {
    const char* v = std::getenv("JAXCOLL_SYNC_WAIT_US");
    const long us = v && *v ? std::strtol(v, nullptr, 10) : 2000;
    return std::chrono::duration_cast<Clock::duration>(std::chrono::microseconds(std::max(0L, us)));
  }();
  return d;
}

}  // namespace

Status execute_rank(Communicator& comm, int64_t run_id, const Plan& plan, int32_t rank, const CallBuffers& b,
                    const CallSite& site, double timeout_s, const Helpers& helpers, Completion completion,
                    bool& pending) {
  pending = false;
  if (comm.failed())
    return Status::Error(site.describe() + ": an earlier call of this collective failed and left its peers in an "
                         "unknown state; restart the process. The failure was: " + comm.failure());
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  if (rank < 0 || rank >= plan.nranks)
    return fail_with(comm, site, rank, "rank is out of range for a plan of " + std::to_string(plan.nranks) +
                                           " ranks (the rank operand must be the position in the group)");
  if (comm.nranks() != plan.nranks)
    return fail_with(comm, site, rank, "communicator has " + std::to_string(comm.nranks()) +
                                           " ranks, the plan " + std::to_string(plan.nranks));
  if (b.input_elements % plan.in_blocks)
    return fail_with(comm, site, rank, "input of " + std::to_string(b.input_elements) +
                                           " elements does not split into the plan's in_blocks=" +
                                           std::to_string(plan.in_blocks) + " blocks");
  const int64_t block = b.input_elements / plan.in_blocks;
  if (b.output_elements != block * plan.out_blocks)
    return fail_with(comm, site, rank, "output has " + std::to_string(b.output_elements) + " elements, the plan "
                                       "needs out_blocks*block=" + std::to_string(plan.out_blocks) + "*" +
                                       std::to_string(block));
  const size_t dsize = dtype_size(b.dtype);
  static const bool trace = std::getenv("JAXCOLL_TRACE") != nullptr;
  if (trace) std::fprintf(stderr, "jaxcoll trace: rank %d joins launch %lld\n", rank, (long long)run_id);
  Rendezvous* rv = comm.join(rank, run_id, site);
  if (!rv) return fail_with(comm, site, rank, "out of memory for the call's rendezvous");
  RankSlot& me = rv->slot(rank);
  const RankProgram& prog = plan.ranks[rank];

  // Each rank advises the output it is about to receive, before any peer writes to it.
  advise_huge_pages(b.output, size_t(b.output_elements) * dsize);
  // Stage XLA's separate buffers into the arrangement an in-place plan expects.
  RankBuffers rb;
  rb.block = block;
  rb.dtype = b.dtype;
  rb.input = const_cast<void*>(b.input);  // out-of-place plans never write it (checked at decode)
  rb.output = b.output;
  CopyOut copy_out;
  if (plan.in_place) {
    if (plan.collective == Collective::kAllGather) {
      rb.input = static_cast<char*>(b.output) + rank * block * int64_t(dsize);
      if (rb.input != b.input) std::memcpy(rb.input, b.input, block * dsize);
    } else if (plan.collective == Collective::kReduceScatter) {
      void* staging = me.staging.reserve(b.input_elements * dsize);
      if (!staging) return fail_with(comm, site, rank, "out of memory for the in-place staging buffer");
      std::memcpy(staging, b.input, b.input_elements * dsize);
      rb.input = staging;
      rb.output = static_cast<char*>(staging) + rank * block * int64_t(dsize);
      copy_out = {b.output, rb.output, size_t(block) * dsize};
    } else {
      if (b.input_elements != b.output_elements)
        return fail_with(comm, site, rank, "an in-place plan needs input and output of one size, got " +
                                               std::to_string(b.input_elements) + " and " +
                                               std::to_string(b.output_elements) + " elements");
      if (b.output != b.input) std::memcpy(b.output, b.input, b.input_elements * dsize);
      rb.input = b.output;
    }
  }
  const int64_t scratch_bytes = int64_t(prog.scratch_chunks / plan.chunk_factor) * block * int64_t(accum_size(b.dtype));
  if (scratch_bytes > 0) {
    rb.scratch = me.scratch.reserve(size_t(scratch_bytes));
    if (!rb.scratch) return fail_with(comm, site, rank, "out of memory for " + std::to_string(scratch_bytes) +
                                                            " bytes of scratch");
  }

  switch (rv->arrive(rank, prog.semaphores, rb, copy_out, std::move(completion), deadline)) {
    case Rendezvous::Arrival::kPending:
      if (rv->wait_finished(rank, std::min(deadline, Clock::now() + sync_wait())) || !rv->defer(rank)) {
        const Status st = rv->status();
        rv->release();
        return st;
      }
      rv->release();  // the completion is owed now; this thread does not touch the rendezvous again
      pending = true;
      watchdog_notify();
      return {};
    case Rendezvous::Arrival::kFailed:
      return Status::Error(site.describe() + ": " + comm.failure());
    case Rendezvous::Arrival::kLeader:
      break;
  }
  return lead_call(comm, rv, plan, rank, b, site, deadline, block, helpers);
}

}  // namespace jaxcoll
