// A decoded plan laid out for the GPU executor (docs/cuda.md, "The plan on the device"): flat arrays the kernel
// indexes directly, plus what the host works out once so the kernel never has to: each wait's position among
// the waits on its semaphore, how many signals a semaphore receives per call (semaphores are monotonic
// counters, so a call's thresholds are offsets from the calls before it), where a lane's thread blocks must
// meet before a step, and whether the low-latency packet protocol can run the plan. Pure C++: no CUDA headers,
// so it is built and tested with the CPU runtime too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "csrc/plan.hpp"
#include "csrc/status.hpp"

namespace jaxcoll::cuda {

// Limits of the device structures (fixed-size arrays in the workspace header and in shared memory).
inline constexpr int32_t kMaxRanks = 64;
inline constexpr int32_t kMaxLanes = 64;
inline constexpr int32_t kMaxStepRefs = 256;

enum class Protocol : int32_t { kAuto = 0, kLL = 1, kBulk = 2 };  // plan header codes (0 auto, 1 ll, 2 simple)
const char* protocol_name(Protocol p);

// Bit i set: the buffer of BufferKind i is touched by a rank other than its owner.
inline constexpr uint32_t kSharedInput = 1u << 0, kSharedOutput = 1u << 1, kSharedScratch = 1u << 2;

struct DeviceStep {
  int32_t op;          // Op code
  int32_t peer;        // signal: receiving rank
  int32_t sem;         // signal / wait
  int32_t first_ref;   // into refs; srcs then dsts
  int32_t nsrc;
  int32_t ndst;
  int32_t ordinal;     // wait: this wait's position (0-based) among its rank's waits on `sem` in one call;
                       // barrier: 1-based position among its lane's barriers; lane sync: see sync_before
  int32_t sync_before; // > 0: the lane's thread blocks meet before this step (1-based count of meetings so far)
};

struct DeviceLane {
  int32_t first_step;
  int32_t nsteps;
  int32_t nbarriers;  // barrier steps in the lane
  int32_t nsyncs;     // lane meetings (sync_before) in the lane
  int32_t first_ref;  // the refs of the lane's steps, contiguous: a block copies them to shared memory at once
  int32_t nrefs;
};

struct DeviceRank {
  int32_t first_lane;
  int32_t nlanes;          // at least 1: a rank without lanes gets an empty one so it still takes part in
                           // the entry and exit of every call
  int32_t input_chunks;
  int32_t output_chunks;
  int32_t scratch_chunks;
  int32_t semaphores;
  uint32_t shared;         // kShared* bits
  int32_t has_barriers;
  int32_t first_unpack;    // packet protocol: output chunk runs written in a call, copied from the packet
  int32_t nunpack;         // mirror to the output at the end (into unpack)
};

struct ChunkRun {
  int32_t index;
  int32_t count;
};

struct PlanImage {
  int32_t nranks = 0;
  int32_t chunk_factor = 1;
  int32_t in_blocks = 1;
  int32_t out_blocks = 1;
  int32_t collective = 0;
  bool in_place = false;
  Protocol requested = Protocol::kAuto;
  int32_t max_lanes = 0;       // most lanes of any rank (after empty lanes were added)
  int32_t max_semaphores = 0;
  int32_t max_refs = 0;        // most refs of any step
  std::vector<DeviceRank> ranks;
  std::vector<DeviceLane> lanes;
  std::vector<DeviceStep> steps;  // rank by rank, lane by lane, in order: traced step times are numbered so
                                  // (csrc/trace_steps.hpp)
  std::vector<ChunkRef> refs;
  std::vector<int32_t> signals_per_call;  // [rank * max_semaphores + sem]
  std::vector<ChunkRun> unpack;
  bool ll_ok = false;          // the packet protocol can run this plan
  std::string ll_reason;       // why not, when it cannot
};

// Lay out `plan` for the GPU; an error names what the GPU executor cannot run (and why).
Status build_plan_image(const Plan& plan, PlanImage& image);

// The protocol a call runs: the plan's request, else the packet protocol up to `ll_max_bytes` of per-rank
// input where the plan allows it. A plan that asks for the packet protocol but cannot use it is an error.
Status choose_protocol(const PlanImage& image, int64_t input_bytes, int64_t ll_max_bytes, Protocol& out);

// Bytes one call reads and writes in all (every rank's data steps), for bandwidth reports.
int64_t traffic_bytes(const PlanImage& image, int64_t block, size_t dsize, size_t asize);

}  // namespace jaxcoll::cuda
