// The local stages of the sparse all-reduce after Ok-Topk (Li and Hoefler, PPoPP 2022). jaxcoll/compress/sparse.py
// runs them around jaxcoll's all_to_all and all_gather; docs/compression.md gives the whole scheme. Each stage is
// one pass over what it reads, and none allocates O(L): the selection reads x once, the owner's sum and reselection
// touch only the received buckets, the result is one write of L elements.
//
// The index space is dealt to the N ranks in stripes: block j of kTopkStripe consecutive elements belongs to
// region j mod N, which rank j mod N owns. A layer whose gradients are larger than the rest (a contiguous run
// of x) so spreads over every owner, as Ok-Topk's balanced regions do, without agreeing on boundaries first.
// An entry's *position* is its place in its region: element i is position (i / (B N)) B + i mod B of region
// (i / B) mod N, B = kTopkStripe.
//
// A *bucket* of capacity c is int32[2][c]: row 0 holds the selected entries' positions, ascending, and kNoEntry
// in the unused slots (all after the used ones); row 1 holds their float32 values' bits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "csrc/status.hpp"

namespace jaxcoll {

inline constexpr int32_t kNoEntry = -1;

// The threshold estimate reads this many elements of x (all of them in a vector up to this size), in runs of
// kTopkSampleRun consecutive elements evenly spaced over x.
inline constexpr int64_t kTopkSample = int64_t{1} << 16;
inline constexpr int64_t kTopkSampleRun = 64;

// The float32 bits of +inf: |x| bits at or above it are inf or NaN, which are always selected.
inline constexpr uint32_t kInfBits = 0x7f800000u;

// A stripe is one 64-byte cache line of float32.
inline constexpr int64_t kTopkStripe = 16;

struct TopkRegions {
  int64_t elements = 0;  // L
  int64_t nranks = 1;    // N

  // Positions in a region: ceil(L / (B N)) B (the last stripes of some regions lie past L).
  int64_t region() const { return (elements + kTopkStripe * nranks - 1) / (kTopkStripe * nranks) * kTopkStripe; }
  // The element at `position` of region p (possibly >= L).
  int64_t element(int64_t p, int64_t position) const {
    return ((position / kTopkStripe) * nranks + p) * kTopkStripe + position % kTopkStripe;
  }
};

// The selection threshold as the float32 bits of a magnitude (for |x| these order as the magnitudes do, NaN
// above inf): the k_s-th largest |x| bits of the sample, k_s = ceil(k S / L) with S = min(L, kTopkSample). The
// sample is x itself when L <= kTopkSample, else the S / 64 runs x[floor(r L / (S / 64)) + i], i < 64. The
// threshold is then raised to `floor`'s bits and to 1 (zeros are never selected) and lowered to kInfBits (inf
// and NaN are always selected). About k entries of x reach it; when L <= kTopkSample exactly the k largest
// magnitudes and their ties do. Deterministic: the same x gives the same threshold.
uint32_t topk_threshold(const float* x, int64_t elements, int64_t k, float floor);

// This rank's N buckets of capacity c, int32[N][2][c]: bucket p holds, in index order, the first c entries of
// region p whose |x| bits reach `threshold`. An entry past a full bucket is not sent (it stays in the residual).
void topk_select(const float* x, const TopkRegions& regions, uint32_t threshold, int64_t capacity,
                 int32_t* buckets);

// The owner's stage: `received` is int32[N][2][c], the N ranks' buckets for this owner's region in rank order.
// Per position, the float32 sum of the ranks' values in rank order (starting from 0); of those sums the `kept` of
// largest magnitude (NaN first, ties to the lower position) go, in position order, into the bucket `out`,
// int32[2][kept]. An error names a bucket whose positions are not ascending or fall outside [0, region).
Status topk_reduce(const int32_t* received, int64_t nranks, int64_t capacity, int64_t region, int64_t kept,
                   int32_t* out);

// The dense result: zero everywhere but at owner p's kept entries (gathered is int32[N][2][kept], owner order):
// the element at each entry's position of region p holds its value. An error names a position past x.
Status topk_result(const int32_t* gathered, const TopkRegions& regions, int64_t kept, float* out);

// This rank's residual: x, with zero where this rank sent an entry (`sent`, its own int32[N][2][c] buckets) and
// the owner kept that position (`gathered`, int32[N][2][kept]). What was not sent or not kept stays.
Status topk_residual(const float* x, const int32_t* sent, int64_t capacity, const int32_t* gathered, int64_t kept,
                     const TopkRegions& regions, float* residual);

}  // namespace jaxcoll
