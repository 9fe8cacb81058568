// What the executor kernel sees: the workspace slot of a rank (its header, semaphores, scratch, staging and
// packet mirrors), the error record, and the kernel's one by-value parameter. Plain structs, no CUDA headers:
// the host code that sets them up is ordinary C++.
#pragma once

#include <cstdint>

#include "csrc/cuda/plan_image.hpp"

namespace jaxcoll::cuda {

// Threads of every executor block.
inline constexpr int kThreads = 512;

// Executor blocks resident on one multiprocessor at least: the kernel's launch bounds hold it to 64 registers a
// thread so two fit, and a launch (cooperative: every block resident at once) can hold 2 x 132 blocks on an H100
// or H200, enough for an emulated 8-rank group at 32 blocks per lane. With a free hand ptxas takes a few more
// registers, one block fits, and the bulk protocol loses up to a tenth of its bandwidth at 16 blocks per lane.
inline constexpr int kResidentBlocksPerSM = 2;

// Ranks one launch may run (the emulated-rank harness runs a whole group in one launch; XLA runs one rank).
inline constexpr int32_t kMaxLaunchRanks = 16;

// Thread blocks per lane at most. Every semaphore is this many counters, one per block of the signalling lane.
inline constexpr int32_t kMaxBlocksPerLane = 32;

// Thread blocks per lane the packet protocol takes by default at most: past a few thousand elements a lane,
// packets cost more than the bulk protocol's rendezvous (JAXCOLL_CUDA_LL_BYTES), so more blocks buy little.
inline constexpr int32_t kMaxPacketBlocks = 16;

// The head of a rank's slot: the synchronisation words of one call site's group on this rank. Every counter is
// monotonic over the life of the slot, so nothing is ever reset between calls (a reset would need the host, or
// a second launch, and could race with a fast peer's next call); call e compares against e-based thresholds.
struct SlotHeader {
  uint64_t epoch;                    // calls this rank has finished; written by its last block, read at entry
  uint64_t arrived;                  // e+1 once this rank has published its buffers for call e
  uint64_t blocks_done;              // this rank's thread blocks that finished, over all calls
  const void* input;                 // this rank's buffers in the current call (bulk protocol); staged
  void* output;                      // (KernelParams::staged): byte offsets from the slot's start instead
  uint64_t exit_from[kMaxRanks];     // peer p stores e+1 here when it has finished call e's steps
  uint64_t lane_arrivals[kMaxLanes]; // lane barriers: each block of a lane adds 1 per barrier and 1 at its end
  uint64_t lane_meetings[kMaxLanes]; // the blocks of one lane meeting between dependent steps
};

// Byte offsets inside a slot; the same for every rank of a group (sizes are maxima over ranks).
struct SlotLayout {
  int64_t semaphores = 0;      // uint64 counters: max_semaphores x kMaxBlocksPerLane (one per signalling block)
  int64_t scratch = 0;         // scratch_chunks/k blocks of the accumulation type
  int64_t staging = 0;         // in-place reduce_scatter: a copy of the input
  int64_t packets[3] = {0, 0, 0};       // packet mirror of input, output, scratch (two parities each)
  int64_t packet_bytes[3] = {0, 0, 0};  // bytes of one parity of each mirror
  // Bulk protocol in a group spanning processes: the rank's input and output staged in its slot (peers in other
  // processes cannot address XLA's buffers, only the slot they mapped through CUDA IPC); 0 when not staged.
  int64_t io_input = 0, io_output = 0;
  int64_t bytes = 0;           // the whole slot
};

// Why a call stopped. The first failing block claims the record; the host formats it (describe_error).
enum class Failure : uint32_t {
  kNone = 0,
  kWait = 1,         // a wait's semaphore was not signalled in time (`buffer` holds the signalling block)
  kEntry = 2,        // a peer never arrived (published its buffers) for this call
  kExit = 3,         // a peer never finished this call's steps
  kPacket = 4,       // a packet of this call never arrived
  kBarrier = 5,      // a lane never reached a lane barrier
  kMeeting = 6,      // a block of the same lane never reached a meeting
  kPrevious = 7,     // packet protocol: a peer had not finished the call before last
  kProcessGone = 8,  // claimed by the host, not a kernel: the process hosting rank `rank` (peer = process) exited
  kPeerFailed = 9,   // claimed by the host: process `peer` failed to set up the group
};

struct ErrorRecord {
  uint32_t claim;    // 0 until a block claims the record; spinning blocks of every rank abort when set
  uint32_t code;     // a Failure, published (release) after the fields below
  int32_t rank, lane, step, sem, peer, buffer;
  uint64_t have, need, epoch;
};

struct RankCall {
  const void* input;
  void* output;
};

// A run of elements split among thread blocks: block b of `parts` moves [min(n, b*per), min(n, b*per + per)).
// The launcher works these out once from the call's shape (chunk offsets need 64-bit divisions, which cost a
// warp about a hundred instructions each: most of a small call's time when every block did them every step).
struct Span {
  int64_t start;  // first element (data steps: of the step's first chunk reference)
  int64_t n;      // elements
  int64_t per;    // elements a block moves: ceil(n / parts), rounded up to whole 16-byte vectors for data steps
};

struct KernelParams {
  const DeviceRank* ranks;
  const DeviceLane* lanes;
  const DeviceStep* steps;
  const ChunkRef* refs;
  const int32_t* signals_per_call;
  const ChunkRun* unpack;
  const int64_t* ref_start;    // [refs] first element of each chunk reference, in elements of its buffer
  const Span* step_span;       // [steps] a data step's elements, split among the lane's blocks
  const Span* unpack_span;     // [unpack] an output run's elements, split among its rank's blocks
  char* const* slots;          // [nranks] each rank's slot, as addressed from the launching device
  ErrorRecord* error;          // host-mapped, shared by every rank of the group
  // Traced calls (jaxcoll.trace): host-mapped, two %globaltimer ns a step (start, end) in csrc/trace_steps.hpp's
  // layout, written by thread 0 of each lane's first block; null when the call is not traced.
  uint64_t* step_times;
  SlotLayout layout;
  uint64_t timeout_ns;
  int32_t nranks, max_semaphores, max_lanes;
  int32_t first_rank, launch_ranks;
  int32_t blocks_per_lane;
  int32_t protocol;            // Protocol::kLL or kBulk
  int32_t staged;              // bulk: ranks' buffers are staged in their slots; headers carry slot offsets
  // Scope of the synchronisation words (1 device, 0 system). `peer_scope`: the words another rank writes or reads
  // (semaphores, the epoch, arrival and exit); device scope only where every rank of the group runs on this GPU.
  // `own_scope`: the words only this rank's own blocks touch (finished blocks, lane barriers and meetings).
  int32_t peer_scope, own_scope;
  int32_t polls_in_flight;     // packets: a data step issues all of an element's source polls before checking any
  RankCall calls[kMaxLaunchRanks];  // [launch_ranks], buffers as staged for the plan
  // [launch_ranks]: where each launched rank's lanes start in `lanes`, so a block finds its lane in one load
  // rather than through its rank's record first.
  int32_t first_lane[kMaxLaunchRanks];
  Span pack[kMaxLaunchRanks];  // [launch_ranks] packets: the input packed at entry, split among the rank's blocks
};

// How the kernel runs a group's calls where several ways are correct: picked at the launcher's creation, from
// the environment (JAXCOLL_CUDA_POLL, JAXCOLL_CUDA_SCOPE) unless the caller names one, so a benchmark compares
// the variants in one process.
enum class PacketPolls : int32_t { kDefault = 0, kInFlight = 1, kInOrder = 2 };
enum class CounterScope : int32_t { kDefault = 0, kNarrowest = 1, kSystem = 2 };

}  // namespace jaxcoll::cuda
