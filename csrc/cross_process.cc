#include "csrc/cross_process.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "csrc/collectives.hpp"
#include "csrc/cross_process_call.hpp"
#include "csrc/env.hpp"
#include "csrc/layout.hpp"
#include "csrc/memory.hpp"
#include "csrc/shared_memory.hpp"
#include "csrc/trace.hpp"
#include "csrc/transport.hpp"
#include "csrc/workers.hpp"
#include "csrc/world.hpp"

namespace jaxcoll {

namespace {

// Helper threads a call of this process may use: the host's cores split among the job's processes on this host,
// less the worker's own; JAXCOLL_SPAN_HELPERS overrides (read once).
int helpers_per_call(const World& w) {
  static const int n = [&w] {
    int local = 0;
    for (int32_t p = 0; p < w.nprocesses(); ++p) local += w.same_host(p, w.process);
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return env_settings().span_helpers.value_or(std::max(0, cores / std::max(1, local) - 1));
  }();
  return n;
}

}  // namespace

Registry& registry() {
  static Registry* r = new Registry();  // leaked on purpose: the watchdog and network threads outlive statics
  return *r;
}

CrossProcessCommunicator::~CrossProcessCommunicator() {
  unwatch(this);
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.comms.find({callsite_, group_});
  if (it != reg.comms.end() && it->second.expired()) reg.comms.erase(it);
}

namespace {
std::atomic<uint64_t> next_data_id{1};
}  // namespace

namespace {

// 1. Every peer process's slot for this call.
Status find_peers(CrossProcessCall& call) {
  CrossProcessCommunicator& c = call.comm_;
  SlotHeader& me = call.header();
  for (;;) {
    if (c.failed()) return Status::Error(c.failure());
    const uint32_t seen = me.bell.word.load(std::memory_order_seq_cst);
    bool all = true;
    {
      std::lock_guard<std::mutex> lock(c.mu_);
      for (size_t i = 0; i < c.peers_.size(); ++i) {
        if (call.found_[i]) continue;
        bool found = false;
        if (Status st = call.peer_calls_[i]->find(found); !st.ok()) return st;
        if (found) {
          call.found_[i] = true;
          call.peer_calls_[i]->wake();  // it may be waiting for us
        }
        all &= found;
      }
    }
    if (all) break;
    call.poll();
    if (c.failed()) return Status::Error(c.failure());
    if (Clock::now() >= call.deadline_) {
      // A peer that failed the call is why (this process may have been the one stopped past its deadline).
      if (std::string cause = call.any_peer_failure(); !cause.empty()) return Status::Error(cause);
      std::string missing;
      for (size_t i = 0; i < c.peers_.size(); ++i)
        if (!call.found_[i])
          missing += (missing.empty() ? "" : "; ") + c.describe_process(c.peers_[i]);
      return Status::Error(call.site_.describe() + ": timed out waiting for every process to arrive (launch " +
                           std::to_string(call.run_id_) + ", call " + std::to_string(call.iteration_) +
                           " of this site in it); never arrived: " + missing +
                           " (timeout set by JAXCOLL_TIMEOUT; a process that never arrives usually ran a different "
                           "program or failed before this collective)");
    }
    wait_for(me.bell, [&] { return me.bell.word.load(std::memory_order_seq_cst) != seen; },
             [&] { return c.failed(); }, std::min(call.deadline_, Clock::now() + std::chrono::milliseconds(20)));
  }
  // A peer may have failed the call before this process arrived: no step runs with it.
  if (const std::string cause = call.any_peer_failure(); !cause.empty()) return Status::Error(cause);
  return {};
}

// A traced call that failed before its steps (a process never arrived, or failed it first): each local rank's wait
// for its peers, unfinished, until now.
void trace_unstarted(const CrossProcessCall& call) {
  if (!tracing()) return;
  const CrossProcessCommunicator& c = call.comm_;
  const int64_t number = next_traced_call(), now = trace_now_ns();
  const JobCall job = call.job_call();
  for (size_t i = 0; i < c.local_.size(); ++i)
    if (call.arrived_ns_[i])
      record_trace_event(arrival_event(call.site_.callsite, number, call.site_.group, job, c.local_[i],
                                       call.arrived_ns_[i], now, kTraceUnfinished));
}

// The worker's part of a call: find the peers, run the local ranks' lanes, wait for every process to finish.
Status run_call(CrossProcessCall& call) {
  CrossProcessCommunicator& c = call.comm_;
  SlotHeader& me = call.header();
  if (Status st = find_peers(call); !st.ok()) {
    trace_unstarted(call);
    return st;
  }

  // 2. The local ranks' lanes, every rank addressed where this process reaches it.
  std::vector<PeerView> views(c.plan_.nranks);
  for (int32_t r : c.local_) views[r] = call.local_views_[c.local_index_[r]];
  for (auto& peer : call.peer_calls_) peer->address(views);
  Status st;
  {
    const CallBuffers& b = call.buffers_[0];
    auto group = std::make_shared<GroupRun>(std::move(views), c.local_, c.plan_, b, call.site_, call.deadline_,
                                            call.block_, me.bell, call, /*whole_group=*/false, call.job_call());
    // Every rank of the group has arrived (each peer process published the call once its own ranks had): the
    // local ranks' waits for their peers end here.
    for (size_t i = 0; i < c.local_.size(); ++i) group->trace_arrival(c.local_[i], call.arrived_ns_[i]);
    // Larger calls are shared with helpers, one per core this process may use beyond the worker's own (the
    // host's cores split among the job's processes on it); small ones cost more to wake helpers for.
    if (call_traffic_bytes(c.plan_, call.block_, call.dtype_) > solo_bytes()) {
      const int n = std::min<int>(helpers_per_call(c.world_), static_cast<int>(c.local_.size()) - 1);
      for (int h = 0; h < n; ++h)
        run_on_worker([group, start = (h + 1) * group->nruns() / (n + 1)] { group->help(start); });
    }
    st = group->lead();
  }
  // A peer that failed the call and left shows here first as a broken read or write: name its reason instead.
  if (!st.ok()) {
    const std::string cause = call.any_peer_failure(/*gone_only=*/true);
    return cause.empty() ? st : Status::Error(cause);
  }

  // 3. Done here; wait until every peer is done with its steps (they may still read this process's buffers).
  me.state.store((generation_of(me.state.load(std::memory_order_relaxed)) << 3) | kDone, std::memory_order_release);
  call.ring_peers();
  call.tell_peers(PeerCall::Event::kDone);
  for (;;) {
    const uint32_t seen = me.bell.word.load(std::memory_order_seq_cst);
    bool all = true;
    for (size_t i = 0; i < c.peers_.size() && all; ++i) all = call.peer_done(i);
    if (all) break;
    call.poll();
    if (c.failed()) return Status::Error(c.failure());
    if (Clock::now() >= call.deadline_) {
      std::string stalled;
      for (size_t i = 0; i < c.peers_.size(); ++i)
        if (!call.peer_done(i)) stalled += "; " + c.describe_stalled(c.peers_[i]);
      return Status::Error(call.site_.describe() + ": timed out waiting for the other processes to finish the call" +
                           stalled);
    }
    wait_for(me.bell, [&] { return me.bell.word.load(std::memory_order_seq_cst) != seen; },
             [&] { return c.failed(); }, std::min(call.deadline_, Clock::now() + std::chrono::milliseconds(20)));
  }

  // 4. This process may exit as soon as the call returns: its done must be out of its hands by then (on the wire,
  // not in a sender's queue), or a peer still waiting for it would see the connection close instead.
  if (!call.flush_peers(call.deadline_))
    return Status::Error(call.site_.describe() + ": timed out handing the end of the call to the other processes "
                         "(a connection takes no data)");
  return {};
}

}  // namespace

// After the call: outputs back to XLA's buffers, peers' slots acknowledged, local ranks completed.
void finish_call(const std::shared_ptr<CrossProcessCall>& call, Status st) {
  CrossProcessCommunicator& c = call->comm_;
  if (!st.ok()) {
    call->fail(st.message());
    // Its peers learn why from this process, not from its exit, if the program stops on the error (a second
    // at most: a connection that takes no data is a peer that will time out on its own).
    call->flush_peers(Clock::now() + std::chrono::seconds(1));
  } else {
    for (const auto& outs : call->copy_out_)
      for (const CopyOut& out : outs) std::memcpy(out.dst, out.src, out.bytes);
  }
  for (auto& peer : call->peer_calls_) peer->finish(st.ok());
  call->status_ = st;
  std::vector<Completion> owed;
  {
    std::lock_guard<std::mutex> lock(c.mu_);
    c.active_.erase(std::remove(c.active_.begin(), c.active_.end(), call), c.active_.end());
    for (size_t i = 0; i < c.local_.size(); ++i) {
      int expected = CrossProcessCall::kWaiting;
      if (call->handoff_[i].compare_exchange_strong(expected, CrossProcessCall::kInline, std::memory_order_acq_rel))
        call->completions_[i] = nullptr;  // finished on its own thread
      else
        owed.push_back(std::move(call->completions_[i]));
    }
  }
  call->finished_.ring();
  // Each completion on its own worker: one may resume an XLA program that waits for the others.
  for (Completion& done : owed)
    run_on_worker([done = std::move(done), st]() mutable { done(st); });
}

bool CrossProcessCommunicator::expire(Clock::time_point now, std::vector<Completion>& pending, Status& error) {
  (void)pending;
  (void)error;
  std::vector<std::shared_ptr<CrossProcessCall>> expired;
  bool gathering = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& call : active_) {
      if (call->arrived_ == static_cast<int32_t>(local_.size())) continue;
      if (now < call->deadline_) {
        gathering = true;
        continue;
      }
      expired.push_back(call);
    }
  }
  for (auto& call : expired) {
    std::string missing;
    for (size_t i = 0; i < local_.size(); ++i)
      if (!call->arrived(i)) missing += (missing.empty() ? "" : ", ") + std::to_string(local_[i]);
    // On a worker: the watchdog holds its lock here, and a call may hold the last reference to its call site.
    const Status st = Status::Error(call->site_.describe() + ": timed out waiting for this process's ranks to "
                                    "arrive (launch " + std::to_string(call->run_id_) + ", call " +
                                    std::to_string(call->iteration_) + " of this site in it); ranks that never "
                                    "arrived: [" + missing + "] (timeout set by JAXCOLL_TIMEOUT; a rank that never "
                                    "arrives usually ran a different program or failed before this collective)");
    run_on_worker([call, st] { finish_call(call, st); });
  }
  return gathering;
}

namespace {

// A free slot of this process's directory (its last call acknowledged by every peer), claimed for a call.
int32_t claim_slot(CrossProcessCommunicator& c) {
  Directory& d = c.directory();
  for (int32_t s = 0; s < kSlots; ++s) {
    SlotHeader& h = d.slots[s];
    const uint64_t st = h.state.load(std::memory_order_acquire);
    const uint64_t ph = phase_of(st);
    if (ph == kFree || (ph == kDone && h.acks.load(std::memory_order_acquire) == c.maps_segments_)) {
      bool busy = false;
      for (auto& a : c.active_) busy |= a->slot_ == s;
      if (busy) continue;
      h.acks.store(0, std::memory_order_relaxed);
      h.state.store(((generation_of(st) + 1) << 3) | kFilling, std::memory_order_release);
      return s;
    }
  }
  return -1;
}

}  // namespace


uint64_t plan_fingerprint(const int32_t* words, size_t nwords, int32_t reduce_op) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint32_t w) {
    for (int i = 0; i < 4; ++i) {
      h ^= (w >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (size_t i = 0; i < nwords; ++i) mix(static_cast<uint32_t>(words[i]));
  mix(static_cast<uint32_t>(reduce_op));
  return h;
}

std::shared_ptr<CrossProcessCommunicator> cross_process_communicator_for(int64_t callsite, int32_t group,
                                                                         const Plan& plan,
                                                                         const std::vector<int32_t>& processes,
                                                                         uint64_t fingerprint, int64_t elements,
                                                                         DType dtype, Status& status) {
  const World* w = world();
  if (!w) {
    status = Status::Error("jaxcoll callsite " + std::to_string(callsite) +
                           ": this group spans several processes, but jaxcoll's multi-process runtime is not set "
                           "up in this process (jax.distributed.initialize comes first; then jaxcoll sets it up "
                           "when such a call is compiled, or jaxcoll.distributed.connect() does)");
    return nullptr;
  }
  for (int32_t p : processes)
    if (p < 0 || p >= w->nprocesses()) {
      status = Status::Error("jaxcoll callsite " + std::to_string(callsite) + ": the plan names process " +
                             std::to_string(p) + ", but the job has " + std::to_string(w->nprocesses()));
      return nullptr;
    }
  Registry& reg = registry();
  std::unique_lock<std::mutex> lock(reg.mu);
  if (auto c = reg.comms[{callsite, group}].lock()) return c;
  auto made = std::make_shared<CrossProcessCommunicator>(callsite, group, plan, processes, fingerprint, elements, dtype,
                                                     *w);
  made->iterations_.resize(made->local_.size());
  status = made->open_directory();
  if (!status.ok()) {
    reg.comms.erase({callsite, group});
    lock.unlock();  // its destructor takes the registry's lock
    return nullptr;
  }
  reg.comms[{callsite, group}] = made;
  return made;
}

Status execute_cross_process_rank(CrossProcessCommunicator& c, int64_t run_id, const Plan& plan, int32_t rank,
                                  const CallBuffers& b, const CallSite& site, double timeout_s, Completion completion,
                                  bool& pending) {
  pending = false;
  if (c.failed())
    return Status::Error(site.describe() + ": an earlier call of this collective failed and left its peers in an "
                         "unknown state; restart the job. The failure was: " + c.failure());
  const int32_t li = (rank >= 0 && rank < plan.nranks) ? c.local_index_[rank] : -1;
  if (li < 0)
    return Status::Error(site.describe() + ": rank " + std::to_string(rank) + " is not hosted by process " +
                         std::to_string(c.me_) + " (the plan's process map puts it elsewhere)");
  if (b.input_elements % plan.in_blocks)
    return Status::Error(site.describe() + ": rank " + std::to_string(rank) + ": input of " +
                         std::to_string(b.input_elements) + " elements does not split into the plan's in_blocks=" +
                         std::to_string(plan.in_blocks) + " blocks");
  const int64_t block = b.input_elements / plan.in_blocks;
  if (b.output_elements != block * plan.out_blocks)
    return Status::Error(site.describe() + ": rank " + std::to_string(rank) + ": output has " +
                         std::to_string(b.output_elements) + " elements, the plan needs out_blocks*block=" +
                         std::to_string(plan.out_blocks) + "*" + std::to_string(block));
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  const size_t dsize = dtype_size(b.dtype);
  if (env_settings().log_joins) std::fprintf(stderr, "jaxcoll: rank %d joins launch %lld\n", rank, (long long)run_id);

  // Join (or open) the call: the first local rank claims a slot and sizes its data segment.
  std::shared_ptr<CrossProcessCall> call;
  {
    std::lock_guard<std::mutex> lock(c.mu_);
    if (c.failed()) return Status::Error(site.describe() + ": " + c.failure());
    auto& iters = c.iterations_[li];
    const uint64_t iteration = ++iters[run_id];
    if (iters.size() > 64) iters.erase(iters.begin());
    for (auto& a : c.active_)
      if (a->run_id_ == run_id && a->iteration_ == iteration) call = a;
    if (!call) {
      const int32_t slot = claim_slot(c);
      if (slot < 0)
        return Status::Error(site.describe() + ": more than " + std::to_string(kSlots) +
                             " calls of this collective are in flight in this process");
      size_t bytes = 0;
      c.layout(c.me_, block, b.dtype, bytes);
      if (c.data_[slot].size() < bytes) {
        const uint64_t id = next_data_id.fetch_add(1);
        Status st = SharedSegment::create(c.data_name(c.me_, id), align_up(bytes, size_t(2) << 20), c.data_[slot]);
        if (!st.ok()) return st;
        c.data_ids_[slot] = id;
      }
      // Scratch that no other process maps stays in this process's memory, kept per slot (layout).
      std::vector<void*> private_scratch(c.local_.size(), nullptr);
      for (size_t i = 0; i < c.local_.size(); ++i) {
        const size_t scratch = scratch_bytes(plan, c.local_[i], block, b.dtype);
        if (scratch == 0 || c.shares_scratch(c.local_[i])) continue;
        private_scratch[i] = c.private_scratch_[slot][i].reserve(scratch);
        if (!private_scratch[i])
          return Status::Error(site.describe() + ": out of memory for " + std::to_string(scratch) +
                               " bytes of scratch of rank " + std::to_string(c.local_[i]));
      }
      call = std::make_shared<CrossProcessCall>(c, run_id, iteration, slot, block, b.dtype, site, deadline);
      call->staging_.resize(c.local_.size());
      // Views of the local ranks into this call's data segment (XLA's buffers are filled in as ranks arrive).
      const std::vector<RankArea> areas = c.layout(c.me_, block, b.dtype, bytes);
      char* base = static_cast<char*>(c.data_[slot].data());
      call->local_views_.resize(c.local_.size());
      for (size_t i = 0; i < c.local_.size(); ++i) {
        const RankArea& a = areas[c.local_[i]];
        PeerView& v = call->local_views_[i];
        v.semaphores = reinterpret_cast<std::atomic<uint32_t>*>(base + a.semaphores);
        v.bell = &call->header().bell;
        v.scratch = a.scratch == kPrivate ? private_scratch[i] : base + a.scratch;
        v.shared_input = a.input == kPrivate ? nullptr : base + a.input;
        v.shared_output = a.output == kPrivate ? nullptr : base + a.output;
        v.input_chunks = v.shared_input ? c.chunk_flags(c.local_[i], BufferKind::kInput).data() : nullptr;
        v.output_chunks = v.shared_output ? c.chunk_flags(c.local_[i], BufferKind::kOutput).data() : nullptr;
      }
      c.active_.push_back(call);
    }
  }
  // A rank with another shape fails the call, but still arrives: the call's other ranks learn of it as it ends.
  const bool mismatch = call->block_ != block || call->dtype_ != b.dtype;
  if (mismatch)
    call->fail(site.describe() + ": rank " + std::to_string(rank) + " called with " + std::to_string(block) +
               "-element blocks of " + dtype_name(b.dtype) + ", another rank of this process with " +
               std::to_string(call->block_) + " of " + dtype_name(call->dtype_) +
               "; every rank must pass the same shape");

  // Stage this rank's buffers as the plan's arrangement and the sharing need (outside the lock: ranks in parallel).
  PeerView& v = call->local_views_[li];
  const RankProgram& prog = plan.ranks[rank];
  std::vector<CopyOut> copy_out;
  if (!mismatch) {
    std::memset(static_cast<void*>(v.semaphores), 0, size_t(prog.semaphores) * sizeof(uint32_t));
    const size_t in_bytes = size_t(b.input_elements) * dsize, out_bytes = size_t(b.output_elements) * dsize;
    if (!plan.in_place) {
      // XLA's buffers, with the shared chunks in the copies peers reach: inputs copied in now, outputs back after.
      v.input = const_cast<void*>(b.input);
      v.output = b.output;
      if (v.shared_input)
        for_each_run(c.chunk_flags(rank, BufferKind::kInput), plan.chunk_factor, block, dsize,
                     [&](size_t offset, size_t bytes) {
                       std::memcpy(static_cast<char*>(v.shared_input) + offset,
                                   static_cast<const char*>(b.input) + offset, bytes);
                     });
      if (v.shared_output)
        for_each_run(c.chunk_flags(rank, BufferKind::kOutput), plan.chunk_factor, block, dsize,
                     [&](size_t offset, size_t bytes) {
                       copy_out.push_back({static_cast<char*>(b.output) + offset,
                                           static_cast<char*>(v.shared_output) + offset, bytes});
                     });
    } else {
      // In-place plans share input and output whole (v.shared_output is their one copy), or not at all.
      const bool shared_io = v.shared_output != nullptr;
      v.input_chunks = v.output_chunks = nullptr;
      void* io = shared_io ? v.shared_output : b.output;
      const InPlace aliasing = collective_info(plan.collective).in_place;
      if (aliasing == InPlace::kInputInOutput) {
        v.output = io;
        v.input = static_cast<char*>(io) + rank * block * int64_t(dsize);
        std::memcpy(v.input, b.input, block * dsize);
        if (shared_io) copy_out.push_back({b.output, io, out_bytes});
      } else if (aliasing == InPlace::kOutputInInput) {
        void* staging = shared_io ? io : call->staging_[li].reserve(in_bytes);
        if (!staging) {
          call->fail(site.describe() + ": out of memory for the in-place staging buffer");
        } else {
          std::memcpy(staging, b.input, in_bytes);
          v.input = staging;
          v.output = static_cast<char*>(staging) + rank * block * int64_t(dsize);
          copy_out.push_back({b.output, v.output, size_t(block) * dsize});
        }
      } else {
        if (io != b.input) std::memcpy(io, b.input, in_bytes);
        v.input = v.output = io;
        if (shared_io) copy_out.push_back({b.output, io, out_bytes});
      }
    }
    advise_huge_pages(b.output, out_bytes);
  }

  const int64_t arrived_ns = tracing() ? trace_now_ns() : 0;
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(c.mu_);
    call->buffers_[li] = b;
    call->arrived_ns_[li] = arrived_ns;
    call->copy_out_[li] = std::move(copy_out);
    call->completions_[li] = std::move(completion);
    call->arrived_ranks_[li] = true;
    call->handoff_[li].store(CrossProcessCall::kWaiting, std::memory_order_relaxed);
    last = ++call->arrived_ == static_cast<int32_t>(c.local_.size());
    if (last) {
      // Publish: peers may now find the call, map its segment and signal its semaphores.
      SlotHeader& h = call->header();
      h.run_id.store(run_id, std::memory_order_relaxed);
      h.iteration.store(call->iteration_, std::memory_order_relaxed);
      h.block.store(block, std::memory_order_relaxed);
      h.dtype.store(static_cast<int32_t>(b.dtype), std::memory_order_relaxed);
      h.data_id.store(c.data_ids_[call->slot_], std::memory_order_relaxed);
      h.state.store((generation_of(h.state.load(std::memory_order_relaxed)) << 3) | kPublished,
                    std::memory_order_release);
    }
  }
  if (last) {
    call->tell_peers(PeerCall::Event::kPublished);
    run_on_worker([call] { finish_call(call, run_call(*call)); });
  }

  // Finish on this thread if the call is done soon (saves a worker hop), else return pending.
  std::atomic<int>& h = call->handoff_[li];
  wait_for(call->finished_, [&] { return h.load(std::memory_order_acquire) != CrossProcessCall::kWaiting; },
           [] { return false; }, std::min(deadline, Clock::now() + sync_wait()));
  int expected = CrossProcessCall::kWaiting;
  if (h.compare_exchange_strong(expected, CrossProcessCall::kDeferred, std::memory_order_acq_rel)) {
    pending = true;
    watchdog_notify();
    return {};
  }
  return call->status_;
}

}  // namespace jaxcoll
