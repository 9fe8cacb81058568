// How the processes of one host that share a CUDA group find each other's slots (docs/cuda.md, "Groups across
// processes"). jax.distributed's key-value store has already joined the job (jaxcoll/distributed.py: the token,
// every process's pid and host, world.hpp); per group, each process then publishes a small *offer* in a
// shared-memory segment of its own, named from the token, its pid and the call site, exactly as the CPU path finds
// its peers' call slots (cross_process.hpp). An offer carries the process's ranks of the group, each rank's slot as a
// CUDA IPC handle and its GPU's PCI bus id, the plan fingerprint, the protocol and the most thread blocks per lane
// its GPUs hold. Every process reads every peer's offer, checks that they agree, and maps the peers' slots.
//
// The group's error record lives in the offer segment of the group's first process (the process of rank 0),
// registered with CUDA in every process, so a kernel that gives up on any GPU stops every rank's kernel. While the
// group lives, a watchdog thread claims the record when a peer process exits (its pidfd, world.hpp) or reports
// that its own setup failed: every rank's kernel then stops within one poll of the record instead of timing out,
// and the next call names the process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "csrc/cuda/ipc.hpp"
#include "csrc/cuda/kernel_params.hpp"
#include "csrc/status.hpp"

namespace jaxcoll::cuda {

// What this process tells its peers about its ranks of one group.
struct SlotOffer {
  uint64_t fingerprint = 0;       // plan words, reduction, dtype and sizes: equal in every process of the group
  int32_t protocol = 0;           // Protocol chosen for the group's calls
  int32_t most_blocks = 0;        // thread blocks per lane every local GPU can hold; the group runs the fewest
  std::vector<int32_t> ranks;     // this process's ranks of the group, ascending
  std::vector<IpcHandle> slots;   // per rank in `ranks`: its slot
  std::vector<std::string> buses; // per rank in `ranks`: its GPU's PCI bus id
};

class SlotExchange {
 public:
  ~SlotExchange();

  // Publish this process's offer for (callsite, group), whose ranks live in processes[r] (job process indices),
  // then wait until every other process of the group has published its own (the first process's segment also
  // holds the error record) and check that they agree. A peer that exits, or whose own setup failed, is named at
  // once; one that never publishes, after `timeout_s`. A setup that fails after publishing says why in its offer
  // (kept for the life of the process), so its peers fail with its message too. Needs the job (world.hpp).
  static Status exchange(int64_t callsite, int32_t group, const std::vector<int32_t>& processes,
                         const SlotOffer& mine, double timeout_s, std::unique_ptr<SlotExchange>& out);

  // Rank r's slot handle (r hosted by another process).
  const IpcHandle& slot(int32_t rank) const { return handles_[rank]; }
  // The fewest thread blocks per lane any process's GPUs hold.
  int32_t blocks() const { return blocks_; }
  // The group's error record, mapped into every GPU of this process.
  ErrorRecord* error_record() const { return record_; }

  // "process 1 (pid N, ranks [2, 3] of this group)".
  std::string describe_process(int32_t process) const;
  // Why process p's setup of this group failed (its offer says so), or an empty string.
  std::string peer_failure(int32_t process) const;
  const std::vector<int32_t>& processes() const { return processes_; }

 private:
  SlotExchange() = default;
  // exchange() less the failure report: leaves what it made in `out`, also when it fails.
  static Status run_exchange(int64_t callsite, int32_t group, const std::vector<int32_t>& processes,
                             const SlotOffer& mine, double timeout_s, std::unique_ptr<SlotExchange>& out);
  // The watchdog (one thread for every group of the process, started with the first).
  static void watch(const SlotExchange* x);
  static void unwatch(const SlotExchange* x);
  static void run_watchdog();
  struct Segments;
  std::unique_ptr<Segments> segments_;
  std::vector<int32_t> processes_;
  std::vector<IpcHandle> handles_;
  int32_t blocks_ = 0;
  ErrorRecord* record_ = nullptr;
  void* registered_ = nullptr;  // the host pages registered with CUDA (unregistered on destruction)
};

}  // namespace jaxcoll::cuda
