#include "csrc/executor.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "csrc/env.hpp"
#include "csrc/layout.hpp"
#include "csrc/memory.hpp"
#include "csrc/reduce.hpp"
#include "csrc/trace.hpp"

namespace jaxcoll {

namespace {
// A function's static, not a global: the setting is read on first use, never while the library loads.
std::atomic<int64_t>& solo_limit() {
  static std::atomic<int64_t> limit{env_settings().solo_bytes.value_or(int64_t{2} << 20)};
  return limit;
}
}  // namespace

int64_t solo_bytes() { return solo_limit().load(std::memory_order_relaxed); }
void set_solo_bytes(int64_t bytes) { solo_limit().store(bytes, std::memory_order_relaxed); }

double default_timeout_s() { return env_settings().timeout_s.value_or(300.0); }

namespace {

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

// The leader: run the call for every rank, settle the copies owed, recycle the rendezvous and complete the ranks
// that arrived first (through the helpers' scheduler, so their programs continue in parallel).
Status lead_call(Communicator& comm, Rendezvous* rv, const Plan& plan, int32_t rank, const CallBuffers& b,
                 const CallSite& site, Clock::time_point deadline, int64_t block, const Helpers& helpers) {
  Status st = check_peers(*rv, plan, rank, block, b.dtype, site);
  if (st.ok()) {
    std::vector<PeerView> views(plan.nranks);
    std::vector<int32_t> ranks(plan.nranks);
    for (int32_t r = 0; r < plan.nranks; ++r) {
      RankSlot& s = rv->slot(r);
      views[r] = {s.buffers.input, s.buffers.output, s.buffers.scratch, s.semaphores.get(), &rv->bell()};
      ranks[r] = r;
    }
    auto group = std::make_shared<GroupRun>(std::move(views), ranks, plan, b, site, deadline, block, rv->bell(),
                                            comm, /*whole_group=*/true);
    for (int32_t r = 0; r < plan.nranks; ++r) group->trace_arrival(r, rv->slot(r).arrived_ns);
    if (!solo_call(plan, b)) {
      // A call large enough to share is offered to the ranks still waiting on their own threads as well as to
      // the pool's helpers: with more threads than cores, a lane blocked on a peer's signal less often leaves a
      // core idle while a sleeping helper is woken (8 ranks, 2 cores: all_to_all of 1 MiB a rank 1.32 against
      // 1.52 ms a call, all_gather of 64 KiB 0.97x XLA against 0.85x; docs/benchmarks.md "Every shared call,
      // every waiting rank").
      rv->share(group);
      if (helpers.schedule) {
        const int n = std::min<int>(helpers.count, plan.nranks - 1);
        for (int h = 0; h < n; ++h)
          helpers.schedule([group, start = (h + 1) * plan.nranks / (n + 1)] { group->help(start); });
      }
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

}  // namespace

// How long a rank that arrives before the last waits on its own thread for the call to finish before it
// returns pending (JAXCOLL_SYNC_WAIT_US, default 2000). Finishing on its own thread saves the hop through a pool
// thread that a completion costs (64 KiB all_reduce in a loop: 0.18 ms per call through the pool); the bound
// keeps a waiting thread from ever being what a peer's call is queued behind.
Clock::duration sync_wait() {
  static const Clock::duration d = std::chrono::duration_cast<Clock::duration>(
      std::chrono::microseconds(env_settings().sync_wait_us.value_or(2000)));
  return d;
}

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
  if (env_settings().log_joins) std::fprintf(stderr, "jaxcoll: rank %d joins launch %lld\n", rank, (long long)run_id);
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
    switch (collective_info(plan.collective).in_place) {
      case InPlace::kInputInOutput:
        rb.input = static_cast<char*>(b.output) + rank * block * int64_t(dsize);
        if (rb.input != b.input) std::memcpy(rb.input, b.input, block * dsize);
        break;
      case InPlace::kOutputInInput: {
        void* staging = me.staging.reserve(b.input_elements * dsize);
        if (!staging) return fail_with(comm, site, rank, "out of memory for the in-place staging buffer");
        std::memcpy(staging, b.input, b.input_elements * dsize);
        rb.input = staging;
        rb.output = static_cast<char*>(staging) + rank * block * int64_t(dsize);
        copy_out = {b.output, rb.output, size_t(block) * dsize};
        break;
      }
      case InPlace::kSame:
        if (b.input_elements != b.output_elements)
          return fail_with(comm, site, rank, "an in-place plan needs input and output of one size, got " +
                                                 std::to_string(b.input_elements) + " and " +
                                                 std::to_string(b.output_elements) + " elements");
        if (b.output != b.input) std::memcpy(b.output, b.input, b.input_elements * dsize);
        rb.input = b.output;
        break;
    }
  }
  if (const size_t scratch = scratch_bytes(plan, rank, block, b.dtype)) {
    rb.scratch = me.scratch.reserve(scratch);
    if (!rb.scratch) return fail_with(comm, site, rank, "out of memory for " + std::to_string(scratch) +
                                                            " bytes of scratch");
  }

  me.arrived_ns = tracing() ? trace_now_ns() : 0;
  switch (rv->arrive(rank, prog.semaphores, rb, copy_out, std::move(completion), deadline)) {
    case Rendezvous::Arrival::kPending:
      if (rv->wait_finished(rank, std::min(deadline, Clock::now() + sync_wait()), deadline) || !rv->defer(rank)) {
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
