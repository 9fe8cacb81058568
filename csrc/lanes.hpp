// Running the lanes of a call's ranks: the interpreter of the plan's steps, shared by the in-process executor
// (executor.cc, every rank of the group in this process) and the cross-process one (cross_process.cc, the ranks this
// process hosts, its peers' buffers and semaphores mapped from shared memory). Both describe where each rank's
// buffers and semaphores are in this process's address space (a PeerView per rank); the steps then mean the same
// thing whoever hosts the rank.
//
// A rank's lanes are interleaved cooperatively: a lane runs until it blocks on a wait whose signal has not arrived
// or on a lane barrier, then the next lane runs. Larger calls are shared with helper threads: each claims a rank,
// advances its lanes until they block and releases it, so the work spreads over the cores whatever order the ranks
// arrived in.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "csrc/abi.hpp"
#include "csrc/dtype.hpp"
#include "csrc/plan.hpp"
#include "csrc/status.hpp"
#include "csrc/trace.hpp"
#include "csrc/wait.hpp"

namespace jaxcoll {

struct CallSite;

// The ranks of a peer process reached over the network (net.hpp): their chunks are read and written by messages
// instead of addressed. Each call names the chunk as the plan does; the owner finds it in its own buffers.
class RemoteRanks {
 public:
  virtual ~RemoteRanks() = default;
  // A read begun by begin_read: the chunk lands in its destination while the caller goes on; finish() waits for
  // it (and must be called before the destination is used or freed).
  class Read {
   public:
    virtual ~Read() = default;
    virtual Status finish() = 0;
  };
  virtual std::unique_ptr<Read> begin_read(const ChunkRef& ref, void* dst, size_t bytes) = 0;
  Status read(const ChunkRef& ref, void* dst, size_t bytes) { return begin_read(ref, dst, bytes)->finish(); }
  // Write the chunk from src (queued, ordered before later signals).
  virtual Status write(const ChunkRef& ref, const void* src, size_t bytes) = 0;
  virtual Status signal(int32_t rank, int32_t sem) = 0;
};

// One rank of a call as this process addresses it.
struct PeerView {
  void* input = nullptr;
  void* output = nullptr;
  void* scratch = nullptr;
  std::atomic<uint32_t>* semaphores = nullptr;
  Doorbell* bell = nullptr;  // rung after every signal to this rank: its runner sleeps on it
  // A rank whose buffers other processes reach in part (cross_process.hpp): the chunks flagged here are used in a copy
  // of the buffer in shared memory (same offsets), the others in XLA's buffer above. Null: no chunk is shared.
  void* shared_input = nullptr;
  void* shared_output = nullptr;
  const uint8_t* input_chunks = nullptr;  // per chunk: 1 if shared
  const uint8_t* output_chunks = nullptr;
  RemoteRanks* remote = nullptr;  // set when the rank is reached over the network: nothing above is addressable
};

// Where chunk `ref.index` of the view's buffer starts in this process, for blocks of `block` elements split into
// k chunks, `dsize` bytes an element (`asize` in scratch, which holds the accumulation type).
void* chunk_address(const PeerView& v, const ChunkRef& ref, int64_t k, int64_t block, size_t dsize, size_t asize);

// A call's failure state, as the runners of its lanes see it. The first failure wins; every runner that notices
// failed() stops with failure().
class CallFailure {
 public:
  virtual ~CallFailure() = default;
  virtual void fail(const std::string& message) = 0;
  virtual bool failed() const = 0;
  virtual std::string failure() const = 0;
  // Called by a runner each time it wakes without progress: the place to notice a peer process that has gone
  // (by calling fail()). In-process groups have nothing to poll.
  virtual void poll() {}
  // What the call knows, beyond the plan, of why `ranks` made no progress until the deadline (a process of them
  // alive but stalled), as text to append to the error; "" when nothing (in-process groups).
  virtual std::string stalled(const std::vector<int32_t>& ranks) {
    (void)ranks;
    return {};
  }
};

// One rank's operands of one call, as XLA (or run_plan) hands them over.
struct CallBuffers {
  const void* input;
  void* output;
  int64_t input_elements;
  int64_t output_elements;
  DType dtype;
  ReduceOp op;
};

// Bytes every rank's data steps of one call read and write together, for blocks of `block` elements.
int64_t call_traffic_bytes(const Plan& plan, int64_t block, DType dtype);
// Bytes of every rank's buffers (input, output, scratch) of one call, for blocks of `block` elements: the most a
// call can touch, a chunk read eight times counted once.
int64_t call_footprint_bytes(const Plan& plan, int64_t block, DType dtype);

class RankInterpreter;
struct TracedCall;

// The lanes of `ranks` (every rank of the group in one process, or the ranks this process hosts), run by the
// thread that calls lead() and by any helpers that join with help(). A rank is the unit of work: whoever claims it
// advances its lanes until they block, then releases it (its lanes share semaphore counts, so one thread at a
// time). A helper that starts late, or never, only costs parallelism: the leader alone can always finish.
//
// `bell` is the doorbell every signal to these ranks rings. `whole_group` says every rank of the plan is in
// `ranks`: a full pass in which nothing moves then proves a deadlock; otherwise a signal may still come from
// another process, and only the deadline ends the wait.
class GroupRun {
 public:
  // `job`: how the job's processes name the call, for its trace events (cross-process groups).
  GroupRun(std::vector<PeerView> views, const std::vector<int32_t>& ranks, const Plan& plan, const CallBuffers& b,
           const CallSite& site, Clock::time_point deadline, int64_t block, Doorbell& bell, CallFailure& failure,
           bool whole_group, JobCall job = {});
  ~GroupRun();

  // A helper's whole part: claim ranks until the call is done, sleeping on the bell while every rank it could
  // claim is blocked.
  void help(int32_t start);
  // The leader's part: run until every rank is done, then wait for the helpers inside to leave.
  Status lead();
  int32_t nruns() const { return static_cast<int32_t>(runs_.size()); }
  // A traced call: `rank` arrived at `arrived_ns` and waited for its peers (every rank of the group, in whichever
  // process) until now, when the call starts (an event of the rank's "arrival" track). Does nothing when the call
  // is not traced or arrived_ns is 0.
  void trace_arrival(int32_t rank, int64_t arrived_ns);

 private:
  bool changed(uint32_t seen) const;
  bool gone();
  bool pass(int32_t start, bool& whole);
  Status drive();
  Status blocked(const std::string& why, const std::string& at_barrier);

  std::vector<PeerView> views_;
  std::unique_ptr<TracedCall> traced_;  // set when the call is traced (jaxcoll.trace)
  Doorbell& bell_;
  CallFailure& failure_;
  bool whole_group_;
  std::vector<std::unique_ptr<RankInterpreter>> runs_;
  std::unique_ptr<std::atomic<bool>[]> claimed_;
  std::atomic<int32_t> remaining_{0};
  std::atomic<int32_t> active_{0};  // helpers inside help()
  std::atomic<int32_t> busy_{0};    // threads inside pass()
  std::atomic<uint64_t> epoch_{0};  // advances that moved something
  std::atomic<bool> closed_{false};
  Doorbell quiet_;  // rung as a helper leaves help(), and at the end of a pass that moved something or was the
                    // last one running
  const Clock::time_point deadline_;
};

}  // namespace jaxcoll
