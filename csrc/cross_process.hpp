// Cross-process groups: groups whose ranks live in several processes of a jax.distributed job (the name says
// what sets them apart from the groups of communicator.hpp, whose ranks are all threads of one process).
//
// Each process hosts some of a group's ranks and runs only their lanes (lanes.hpp); the steps that reach a rank in
// another process go through that process's transport (transport.hpp): on this host they read and write that rank's
// buffers in shared memory, as described here; on another host they are messages (transport/tcp.cc). Per call site
// (callsite, group) every process owns a *directory* segment of call slots; a slot names the call it holds (XLA's run
// id, which is the same in every process of a launch, and the call's count within the launch), its state, a doorbell,
// and a data segment holding the semaphores of the process's ranks, their scratch and the buffers peers reach. XLA's
// buffers are private to a process, so a rank's input is copied into its data segment when a peer process reads it, and
// its output copied back when a peer process writes it (the plan says which, per rank and buffer).
//
// One call, in each process:
//   1. Each local rank arrives on its device thread: the first claims a free slot, each stages its input, the
//      last publishes the slot and hands the call to a worker thread (workers.hpp); the device threads return
//      pending (or finish on their own thread if the call is done within JAXCOLL_SYNC_WAIT_US).
//   2. The worker finds each peer process's slot for the same call (their directories are found by name, so no
//      address is exchanged per call), checks that they run the same plan (a fingerprint in the directory) with
//      the same shapes, maps their data segments, and runs the local ranks' lanes.
//   3. It marks the slot done and waits until every peer's slot is done: no rank returns before every rank of
//      the group has finished its steps (docs/plan-ir.md). Then it copies outputs back, completes the local ranks
//      and acknowledges each peer's slot; a slot is reused only when every peer has acknowledged it.
//
// Faults end in an error on every surviving rank, never a hang: a peer process that exits (seen through its
// presence's lock within 50 ms), one that reports a failure in its slot, one that runs another plan or shape at
// this call site, or one that does not arrive within the timeout. A failed call site stays failed, as in one
// process.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "csrc/communicator.hpp"
#include "csrc/executor.hpp"
#include "csrc/plan.hpp"
#include "csrc/status.hpp"

namespace jaxcoll {

class CrossProcessCommunicator;

// The communicator of (callsite, group) for a plan whose ranks live in the processes `processes[r]` (job process
// indices, world.hpp); created on first use. `fingerprint` identifies the plan and reduction: a peer process whose
// directory states another is running a different program at this call site; `elements` (input elements a rank)
// and `dtype` are the call site's shape, which every process must share. The compiled calls that run the
// call site own it (and each call in flight): when the last owner drops it, its segments are unmapped and this
// process's unlinked, so recompiling a program does not grow /dev/shm.
std::shared_ptr<CrossProcessCommunicator> cross_process_communicator_for(int64_t callsite, int32_t group,
                                                                         const Plan& plan,
                                                                         const std::vector<int32_t>& processes,
                                                                         uint64_t fingerprint, int64_t elements,
                                                                         DType dtype, Status& status);

// Rank `rank`'s part of a call of a cross-process group (rank must be hosted here). Like execute_rank: returns OK with
// `pending` set when `completion` will be called later with the call's status.
Status execute_cross_process_rank(CrossProcessCommunicator& comm, int64_t run_id, const Plan& plan, int32_t rank,
                                  const CallBuffers& buffers, const CallSite& site, double timeout_s,
                                  Completion completion, bool& pending);

// Route the network transport's messages (net.hpp) to the cross-process calls they name (transport/tcp.cc);
// before listening.
void serve_network();

// A fingerprint of a plan's words and the call's reduction (FNV-1a), for cross_process_communicator_for.
uint64_t plan_fingerprint(const int32_t* words, size_t nwords, int32_t reduce_op);

}  // namespace jaxcoll
