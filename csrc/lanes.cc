#include "csrc/lanes.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "csrc/communicator.hpp"
#include "csrc/layout.hpp"
#include "csrc/reduce.hpp"
#include "csrc/trace.hpp"
#include "csrc/trace_steps.hpp"

namespace jaxcoll {

void* chunk_address(const PeerView& v, const ChunkRef& ref, int64_t k, int64_t block, size_t dsize, size_t asize) {
  void* base = nullptr;
  switch (ref.buffer) {
    case BufferKind::kInput: base = v.input_chunks && v.input_chunks[ref.index] ? v.shared_input : v.input; break;
    case BufferKind::kOutput: base = v.output_chunks && v.output_chunks[ref.index] ? v.shared_output : v.output; break;
    case BufferKind::kScratch: base = v.scratch; break;
  }
  const size_t esize = ref.buffer == BufferKind::kScratch ? asize : dsize;
  return static_cast<char*>(base) + chunk_start(k, block, ref.index) * int64_t(esize);
}

int64_t call_traffic_bytes(const Plan& plan, int64_t block, DType dtype) {
  return plan.traffic_chunks * block / plan.chunk_factor * int64_t(dtype_size(dtype));
}

int64_t call_footprint_bytes(const Plan& plan, int64_t block, DType dtype) {
  const int64_t chunk = block / plan.chunk_factor;
  return chunk * (plan.buffer_chunks * int64_t(dtype_size(dtype)) + plan.scratch_chunks * int64_t(accum_size(dtype)));
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
  int64_t blocked_since = 0;  // traced calls: when the lane first found its current wait or barrier unmet
};

// What a traced call's events share (jaxcoll.trace): its number, and who signals each semaphore, found once per
// call so that a wait's event can say from whom its signal comes.
struct TracedCall {
  TracedCall(const Plan& plan, const CallSite& site, JobCall job)
      : call(next_traced_call()), callsite(site.callsite), group(site.group), job(job), from(signal_sources(plan)) {}
  int64_t call;
  int64_t callsite;
  int32_t group;
  JobCall job;
  SignalSources from;

  void record(TraceEvent& e) const {
    e.iteration = job.iteration;
    e.launch = job.launch;
    record_trace_event(e);
  }
};

// One rank's program as the CPU interpreter runs it: each lane's position and barrier state, the signals of each
// semaphore consumed so far.
class RankInterpreter {
 public:
  RankInterpreter(const PeerView* views, CallFailure& failure, const Plan& plan, int32_t rank, const CallBuffers& b,
                  const CallSite& site, int64_t block, const TracedCall* traced)
      : views_(views), failure_(failure), plan_(plan), rank_(rank), prog_(plan.ranks[rank]), b_(b), site_(site),
        traced_(traced), k_(plan.chunk_factor), dsize_(dtype_size(b.dtype)), asize_(accum_size(b.dtype)),
        block_(block),
        stream_(stream_call(call_footprint_bytes(plan, block, b.dtype))),
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
    std::atomic<uint32_t>* mine = views_[rank_].semaphores;
    bool progressed = false;
    for (int32_t l = 0; l < nlanes; ++l) {
      LaneState& ls = lanes_[l];
      const Lane& lane = plan_.lanes[prog_.first_lane + l];
      while (!ls.done) {
        const Step& s = plan_.steps[lane.first_step + ls.pc];
        const int64_t start = traced_ ? trace_now_ns() : 0;
        const int32_t pc = ls.pc;
        if (s.op == Op::kWait) {
          if (mine[s.sem].load(std::memory_order_acquire) <= consumed_[s.sem]) {
            if (traced_ && !ls.blocked_since) ls.blocked_since = start;
            break;
          }
          ++consumed_[s.sem];
        } else if (s.op == Op::kBarrier) {
          if (!ls.at_barrier) {
            ls.at_barrier = true;
            ++ls.barriers;
            progressed = true;
          }
          bool all = true;
          for (int32_t o = 0; o < nlanes && all; ++o) all = lanes_[o].done || lanes_[o].barriers >= ls.barriers;
          if (!all) {
            if (traced_ && !ls.blocked_since) ls.blocked_since = start;
            break;
          }
          ls.at_barrier = false;
        } else if (s.op == Op::kSignal) {
          const PeerView& peer = views_[s.peer];
          if (peer.remote) {
            if (Status st = peer.remote->signal(s.peer, s.sem); !st.ok())
              failure_.fail(site_.describe() + ": rank " + std::to_string(rank_) + ": " + st.message());
          } else {
            peer.semaphores[s.sem].fetch_add(1, std::memory_order_release);
            peer.bell->ring();
          }
        } else if (const int32_t run = read_run(lane, ls.pc); run > 1) {
          read_together(lane, ls.pc, run);
          ls.pc += run - 1;  // the run's last step is counted below
        } else {
          data_step(s);
        }
        progressed = true;
        if (traced_) {
          trace_steps(l, lane, pc, ls.pc + 1 - pc, ls.blocked_since ? ls.blocked_since : start, 0);
          ls.blocked_since = 0;
        }
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
    std::string what, stalled;
    std::atomic<uint32_t>* mine = views_[rank_].semaphores;
    for (int32_t l = 0; l < prog_.nlanes; ++l) {
      if (lanes[l].done) continue;
      const Step& s = plan_.steps[plan_.lanes[prog_.first_lane + l].first_step + lanes[l].pc];
      if (s.op != Op::kWait) continue;
      std::string signallers;
      std::vector<int32_t> signalling;  // the ranks whose signal never came
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
        if (!sends) continue;
        signallers += (signallers.empty() ? "" : ", ") + std::to_string(r);
        signalling.push_back(r);
      }
      const std::string of_signallers = failure_.stalled(signalling);
      stalled += of_signallers;
      what += (what.empty() ? "" : "; ") + plan_.where(rank_, l, lanes[l].pc) + " waits on semaphore " +
              std::to_string(s.sem) + ", which received " +
              std::to_string(mine[s.sem].load()) + " signal(s) and needs " +
              std::to_string(consumed[s.sem] + 1) + " (ranks whose plan signals it: [" + signallers + "])" +
              of_signallers;
    }
    // A signaller known to be stalled is the cause; else the plan may be.
    Status err = Status::Error(site_.describe() + ": rank " + std::to_string(rank_) + " " + why + what +
                               (stalled.empty() ? " (timeout set by JAXCOLL_TIMEOUT; the plan may deadlock: check "
                                                  "it with jaxcoll.lang's checker)"
                                                : " (timeout set by JAXCOLL_TIMEOUT)"));
    failure_.fail(err.message());
    return err;
  }

  // A traced call that failed: the waits and barriers its lanes were blocked on, as events that end now.
  void trace_unfinished() {
    if (!traced_) return;
    for (int32_t l = 0; l < prog_.nlanes; ++l) {
      const LaneState& ls = lanes_[l];
      if (!ls.done && ls.blocked_since)
        trace_steps(l, plan_.lanes[prog_.first_lane + l], ls.pc, 1, ls.blocked_since, kTraceUnfinished);
    }
  }

 private:
  // Steps [pc, pc + n) of lane `l` ran from `start` until now (n > 1: reads in flight together).
  void trace_steps(int32_t l, const Lane& lane, int32_t pc, int32_t n, int64_t start, int32_t flags) {
    const int64_t end = trace_now_ns();
    for (int32_t i = 0; i < n; ++i) {
      const Step& s = plan_.steps[lane.first_step + pc + i];
      TraceEvent e{start, end, site_.callsite, traced_->call, 0, site_.group, rank_, l, pc + i, 0, -1, -1, 0, flags};
      describe_step(plan_, traced_->from, rank_, s, {k_, block_, dsize_, asize_}, e);
      if (s.op == Op::kWait) e.count = static_cast<int32_t>(consumed_[s.sem]) + (flags & kTraceUnfinished ? 1 : 0);
      traced_->record(e);
    }
  }

  void data_step(const Step& s) {
    const ChunkRef* refs = plan_.srcs(s);
    const int32_t nref = s.nsrc + s.ndst;
    const ElementRange range = chunk_range(k_, block_, refs[0].index, refs[0].count);
    if (range.size() == 0) return;
    SmallVec<Operand, 24> ops(nref);
    bool remote = false;
    for (int32_t j = 0; j < nref; ++j) {
      const ChunkRef& ref = refs[j];
      const PeerView& v = views_[ref.rank];
      remote |= v.remote != nullptr;
      ops[j] = {v.remote ? nullptr : chunk_address(v, ref, k_, block_, dsize_, asize_),
                ref.buffer == BufferKind::kScratch};
    }
    if (remote) return remote_step(s, refs, ops.data(), range.size());
    reduce_chunks(b_.dtype, b_.op, ops.data(), s.nsrc, ops.data() + s.nsrc, s.ndst, range.size(), stream_);
  }

  // A step that reads one chunk of a rank reached over the network into a local chunk of the same type.
  bool plain_remote_read(const Step& s) const {
    if (s.op == Op::kWait || s.op == Op::kBarrier || s.op == Op::kSignal || s.nsrc != 1 || s.ndst != 1) return false;
    const ChunkRef* refs = plan_.srcs(s);
    return views_[refs[0].rank].remote && !views_[refs[1].rank].remote &&
           (refs[0].buffer == BufferKind::kScratch) == (refs[1].buffer == BufferKind::kScratch);
  }

  static bool overlap(const ChunkRef& a, const ChunkRef& b) {
    return a.rank == b.rank && a.buffer == b.buffer && a.index < b.index + b.count && b.index < a.index + a.count;
  }

  // How many steps of the lane from `pc` on are plain remote reads that may be in flight together (an
  // all_to_all's or all_gather's pulls from network peers): sending them all before awaiting any answer costs the
  // lane one round trip instead of one per step. A run ends at any other step, or at a destination that overlaps
  // an earlier one of the run (where the order the answers arrive in would matter).
  static constexpr int32_t kMaxReadRun = 64;
  int32_t read_run(const Lane& lane, int32_t pc) const {
    ChunkRef dsts[kMaxReadRun];
    int32_t run = 0;
    for (; run < kMaxReadRun && pc + run < lane.nsteps; ++run) {
      const Step& s = plan_.steps[lane.first_step + pc + run];
      if (!plain_remote_read(s)) break;
      const ChunkRef& dst = plan_.srcs(s)[1];
      for (int32_t i = 0; i < run; ++i)
        if (overlap(dst, dsts[i])) return run;
      dsts[run] = dst;
    }
    return run;
  }

  void read_together(const Lane& lane, int32_t pc, int32_t run) {
    std::unique_ptr<RemoteRanks::Read> reads[kMaxReadRun];
    for (int32_t i = 0; i < run; ++i) {
      const ChunkRef* refs = plan_.srcs(plan_.steps[lane.first_step + pc + i]);
      const ElementRange range = chunk_range(k_, block_, refs[0].index, refs[0].count);
      if (range.size() == 0) continue;
      const size_t bytes = size_t(range.size()) * (refs[0].buffer == BufferKind::kScratch ? asize_ : dsize_);
      void* dst = chunk_address(views_[refs[1].rank], refs[1], k_, block_, dsize_, asize_);
      reads[i] = views_[refs[0].rank].remote->begin_read(refs[0], dst, bytes);
    }
    // Every read is finished, failed or not: an answer must not land in a destination after the call moved on.
    for (int32_t i = 0; i < run; ++i)
      if (reads[i])
        if (Status st = reads[i]->finish(); !st.ok())
          failure_.fail(site_.describe() + ": rank " + std::to_string(rank_) + ": " + st.message());
  }

  // A step that names chunks of ranks reached over the network: their sources are read into bounce buffers
  // first, their destinations computed into bounce buffers and written after.
  void remote_step(const Step& s, const ChunkRef* refs, Operand* ops, int64_t elements) {
    const int32_t nref = s.nsrc + s.ndst;
    // A plain copy from a remote chunk into a local one of the same type reads straight into its destination.
    if (s.nsrc == 1 && s.ndst == 1 && views_[refs[0].rank].remote && !views_[refs[1].rank].remote &&
        ops[0].accum == ops[1].accum) {
      const size_t bytes = size_t(elements) * (ops[0].accum ? asize_ : dsize_);
      if (Status st = views_[refs[0].rank].remote->read(refs[0], ops[1].ptr, bytes); !st.ok())
        failure_.fail(site_.describe() + ": rank " + std::to_string(rank_) + ": " + st.message());
      return;
    }
    // Bounce buffers belong to the thread: a step's reads and writes finish before it returns, and buffers kept
    // from call to call do not fault their pages in again on every call.
    thread_local std::vector<GrowableBuffer> bounce;
    if (bounce.size() < size_t(nref)) bounce.resize(nref);
    for (int32_t j = 0; j < nref; ++j) {
      const PeerView& v = views_[refs[j].rank];
      if (!v.remote) continue;
      const size_t bytes = size_t(elements) * (ops[j].accum ? asize_ : dsize_);
      ops[j].ptr = bounce[j].reserve(bytes);
      if (!ops[j].ptr) return failure_.fail(site_.describe() + ": out of memory for a network bounce buffer");
    }
    // The remote sources are read together (one round trip), each finished before the step computes.
    SmallVec<std::unique_ptr<RemoteRanks::Read>, 8> reads(s.nsrc);
    for (int32_t j = 0; j < s.nsrc; ++j)
      if (const PeerView& v = views_[refs[j].rank]; v.remote)
        reads[j] = v.remote->begin_read(refs[j], ops[j].ptr, size_t(elements) * (ops[j].accum ? asize_ : dsize_));
    bool ok = true;
    for (int32_t j = 0; j < s.nsrc; ++j)
      if (reads[j])
        if (Status st = reads[j]->finish(); !st.ok() && ok) {
          ok = false;
          failure_.fail(site_.describe() + ": rank " + std::to_string(rank_) + ": " + st.message());
        }
    if (!ok) return;
    reduce_chunks(b_.dtype, b_.op, ops, s.nsrc, ops + s.nsrc, s.ndst, elements, false);
    for (int32_t j = s.nsrc; j < nref; ++j) {
      const PeerView& v = views_[refs[j].rank];
      if (!v.remote) continue;
      const size_t bytes = size_t(elements) * (ops[j].accum ? asize_ : dsize_);
      if (Status st = v.remote->write(refs[j], ops[j].ptr, bytes); !st.ok())
        return failure_.fail(site_.describe() + ": rank " + std::to_string(rank_) + ": " + st.message());
    }
  }


 private:
  const PeerView* views_;
  CallFailure& failure_;
  const Plan& plan_;
  int32_t rank_;
  const RankProgram& prog_;
  const CallBuffers& b_;
  const CallSite& site_;
  const TracedCall* traced_;  // null unless the call is traced
  int64_t k_;
  size_t dsize_, asize_;
  int64_t block_;
  bool stream_;  // the call moves enough to stream its large destinations past the caches
  SmallVec<LaneState, 16> lanes_;
  SmallVec<uint32_t, 32> consumed_;
  int32_t live_ = 0;
};


GroupRun::GroupRun(std::vector<PeerView> views, const std::vector<int32_t>& ranks, const Plan& plan,
                   const CallBuffers& b, const CallSite& site, Clock::time_point deadline, int64_t block,
                   Doorbell& bell, CallFailure& failure, bool whole_group, JobCall job)
    : views_(std::move(views)), bell_(bell), failure_(failure), whole_group_(whole_group),
      claimed_(std::make_unique<std::atomic<bool>[]>(ranks.size())), deadline_(deadline) {
  if (tracing()) traced_ = std::make_unique<TracedCall>(plan, site, job);
  runs_.reserve(ranks.size());
  for (int32_t r : ranks) {
    runs_.push_back(std::make_unique<RankInterpreter>(views_.data(), failure, plan, r, b, site, block, traced_.get()));
    remaining_ += !runs_.back()->done();
  }
}

GroupRun::~GroupRun() = default;

void GroupRun::trace_arrival(int32_t rank, int64_t arrived_ns) {
  if (!traced_ || !arrived_ns) return;
  record_trace_event(arrival_event(traced_->callsite, traced_->call, traced_->group, traced_->job, rank, arrived_ns,
                                   trace_now_ns(), 0));
}

// A sleeping runner wakes at least every 50 ms (wait_for) and asks this: polling there is what notices a peer
// process that has gone while every lane here waits for its signals.
bool GroupRun::gone() {
  failure_.poll();
  return failure_.failed();
}

void GroupRun::help(int32_t start) {
  active_.fetch_add(1, std::memory_order_seq_cst);
  while (!closed_.load(std::memory_order_seq_cst) && remaining_.load(std::memory_order_acquire) > 0 &&
         !failure_.failed()) {
    const uint32_t seen = bell_.word.load(std::memory_order_seq_cst);
    bool whole = false;
    if (pass(start, whole)) continue;
    if (wait_for(bell_, [&] { return changed(seen); }, [&] { return gone(); }, deadline_) !=
        WaitResult::kReady)
      break;
  }
  active_.fetch_sub(1, std::memory_order_seq_cst);
  quiet_.ring();  // the group's own bell: the rendezvous may be recycled by now
}

Status GroupRun::lead() {
  Status st = drive();
  closed_.store(true, std::memory_order_seq_cst);
  bell_.ring();  // wakes helpers sleeping on a signal
  wait_for(quiet_, [&] { return active_.load(std::memory_order_seq_cst) == 0; }, [] { return false; },
           Clock::time_point::max());
  if (!st.ok() && traced_)
    for (auto& run : runs_) run->trace_unfinished();
  return st;
}

bool GroupRun::changed(uint32_t seen) const {
  return bell_.word.load(std::memory_order_seq_cst) != seen || closed_.load(std::memory_order_seq_cst) ||
         remaining_.load(std::memory_order_acquire) == 0;
}

// A pass proves that nothing can move only from what this thread saw itself: a rank another thread held was
// judged by that thread, possibly from a semaphore read before a signal this thread had just sent (the helper reads
// "not yet", the leader signals and passes again, skips the held rank and finds nothing else to do, the helper
// releases it with nothing done). `whole` says this pass claimed every rank still running. Each advance that moved
// something bumps epoch_ before its rank is released, so a thread that later claims the rank sees the bump.
bool GroupRun::pass(int32_t start, bool& whole) {
  bool progressed = false;
  whole = true;
  const int32_t n = static_cast<int32_t>(runs_.size());
  busy_.fetch_add(1, std::memory_order_seq_cst);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t r = (start + i) % n;
    if (claimed_[r].exchange(true, std::memory_order_acquire)) {
      whole = false;
      continue;
    }
    RankInterpreter& run = *runs_[r];
    if (!run.done() && run.advance()) {
      progressed = true;
      if (run.done()) remaining_.fetch_sub(1, std::memory_order_acq_rel);
      epoch_.fetch_add(1, std::memory_order_seq_cst);
    }
    claimed_[r].store(false, std::memory_order_release);
  }
  const bool last = busy_.fetch_sub(1, std::memory_order_seq_cst) == 1;
  if (active_.load(std::memory_order_relaxed) > 0) {  // no helpers (a solo call): nobody to tell
    if (progressed) bell_.ring();                      // others may now move
    if (progressed || last) quiet_.ring();             // a leader whose pass skipped held ranks waits for this
  }
  return progressed;
}

Status GroupRun::drive() {
  while (remaining_.load(std::memory_order_acquire) > 0) {
    if (failure_.failed()) return Status::Error(failure_.failure());
    const uint32_t seen = bell_.word.load(std::memory_order_seq_cst);
    const uint64_t epoch = epoch_.load(std::memory_order_seq_cst);
    bool whole = false;
    if (pass(0, whole)) continue;
    if (whole_group_ && whole) {
      // Every rank was found blocked by this thread, and no advance anywhere moved since before it looked:
      // every lane of every rank is blocked. Unless the ranks are all done: a helper that finished the last rank
      // between this thread's reads of remaining_ and epoch_ left both changed before the epoch was read.
      if (epoch_.load(std::memory_order_seq_cst) != epoch || remaining_.load(std::memory_order_acquire) == 0)
        continue;
      return blocked("deadlocks: every lane of every rank is blocked, so a semaphore is never signalled: ",
                     "jaxcoll: every lane of every rank is blocked at a barrier (malformed plan)");
    }
    WaitResult w;
    if (whole_group_) {
      // Every signal comes from a pass here: wait until a helper moves something or every helper is out of its
      // pass, then look at every rank again.
      w = wait_for(quiet_,
                   [&] {
                     return changed(seen) || busy_.load(std::memory_order_seq_cst) == 0 ||
                            epoch_.load(std::memory_order_seq_cst) != epoch;
                   },
                   [&] { return gone(); }, deadline_);
    } else {
      w = wait_for(bell_, [&] { return changed(seen); }, [&] { return gone(); }, deadline_);
    }
    if (w == WaitResult::kAborted) return Status::Error(failure_.failure());
    if (w == WaitResult::kTimeout)
      return blocked("timed out: the semaphore was never signalled: ",
                     "jaxcoll: timed out with every lane blocked at a barrier");
  }
  return {};
}

Status GroupRun::blocked(const std::string& why, const std::string& at_barrier) {
  for (auto& run : runs_)
    if (!run->done() && run->waiting()) return run->blocked_error(why);
  return Status::Error(at_barrier);
}

}  // namespace jaxcoll
