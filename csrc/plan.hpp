// The plan IR as the executors hold it, decoded from the int32 words of jaxcoll/plan/wire.py (docs/plan-ir.md,
// "Serialized form"). Decoding validates everything the executor relies on to stay inside its buffers (the
// checks of jaxcoll/plan/validate.py), so a malformed plan is an error with a message, never undefined
// behaviour. Steps, lanes and chunk refs live in flat arrays indexed by position: one allocation per plan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "csrc/collectives.hpp"
#include "csrc/dtype.hpp"
#include "csrc/status.hpp"

namespace jaxcoll {

// Codes are positions in the Python enums (jaxcoll/plan/ir.py): never renumber. The collectives' codes are in
// their table (csrc/collectives.hpp).
enum class Op : int32_t { kCopy, kReduce, kPut, kGet, kReadReduce, kReducePut, kReadReducePut, kZero, kSignal, kWait, kBarrier };
enum class BufferKind : int32_t { kInput, kOutput, kScratch };

inline constexpr int32_t kPlanMagic = 0x4C43584A;
inline constexpr int32_t kPlanVersion = 1;
inline constexpr int32_t kFlagInPlace = 1;

const char* op_name(Op op);
const char* buffer_name(BufferKind b);

struct ChunkRef {
  int32_t rank;
  BufferKind buffer;
  int32_t index;
  int32_t count;
};

struct Step {
  Op op;
  int32_t peer;       // signal: the rank whose semaphore is incremented
  int32_t sem;        // signal / wait: semaphore index on the receiving rank
  int32_t first_ref;  // srcs are refs[first_ref, first_ref + nsrc), dsts follow
  int32_t nsrc;
  int32_t ndst;
  bool is_data() const { return op != Op::kSignal && op != Op::kWait && op != Op::kBarrier; }
};

struct Lane {
  int32_t first_step;
  int32_t nsteps;
};

struct RankProgram {
  int32_t input_chunks;
  int32_t output_chunks;
  int32_t scratch_chunks;
  int32_t semaphores;
  int32_t first_lane;
  int32_t nlanes;
  int32_t chunks(BufferKind b) const {
    return b == BufferKind::kInput ? input_chunks : b == BufferKind::kOutput ? output_chunks : scratch_chunks;
  }
};

struct Plan {
  Collective collective = Collective::kCustom;
  int32_t nranks = 0;
  int32_t in_blocks = 1;
  int32_t out_blocks = 1;
  bool in_place = false;
  int32_t protocol = 0;
  int32_t chunk_factor = 1;  // k: chunks per block, the same in every buffer of every rank
  int32_t max_lanes = 0;     // most lanes of any rank
  int32_t max_semaphores = 0;
  // Chunks read plus chunks written by every data step of every rank: a call moves about
  // traffic_chunks * block / chunk_factor elements in all (how the executor sizes its help).
  int64_t traffic_chunks = 0;
  // Chunks of every rank's input and output buffers, and of every rank's scratch (elements of the accumulation
  // type): all a call can touch, however often its steps reread them (whether it streams its writes past the
  // caches).
  int64_t buffer_chunks = 0;
  int64_t scratch_chunks = 0;
  std::vector<RankProgram> ranks;
  std::vector<Lane> lanes;
  std::vector<Step> steps;
  std::vector<ChunkRef> refs;

  const ChunkRef* srcs(const Step& s) const { return refs.data() + s.first_ref; }
  const ChunkRef* dsts(const Step& s) const { return refs.data() + s.first_ref + s.nsrc; }
  // "rank r, lane l, step i (op)": how error messages point into a plan.
  std::string where(int32_t rank, int32_t lane, int32_t step) const;
  // Every step of a decoded plan, rank by rank, lane by lane, in order: visit(rank, lane, index, step).
  template <class Visit>
  void for_each_step(Visit&& visit) const {
    for (int32_t r = 0; r < nranks; ++r)
      for (int32_t l = 0; l < ranks[r].nlanes; ++l) {
        const Lane& lane = lanes[ranks[r].first_lane + l];
        for (int32_t i = 0; i < lane.nsteps; ++i) visit(r, l, i, steps[lane.first_step + i]);
      }
  }
};

// Bytes of rank `rank`'s scratch in a call of blocks of `block` elements of `dtype`: scratch holds the
// accumulation type (dtype.hpp).
inline size_t scratch_bytes(const Plan& plan, int32_t rank, int64_t block, DType dtype) {
  return size_t(plan.ranks[rank].scratch_chunks / plan.chunk_factor) * size_t(block) * accum_size(dtype);
}

// Decode and structurally validate serialized plan words into `plan`. On failure `plan` is unspecified and the
// status names the word, rank, lane or step at fault.
Status decode_plan(std::span<const int32_t> words, Plan& plan);

}  // namespace jaxcoll
