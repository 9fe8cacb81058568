#include "csrc/topk.hpp"

#include <array>
#include <bit>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "csrc/memory.hpp"

namespace jaxcoll {
namespace {

inline uint32_t magnitude_bits(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }

// Bit i set where entry i of the kTopkStripe at x has |x| bits >= t (t >= 1). Signed compares: SSE2, which
// every x86-64 has, has no unsigned one, and both sides are below 2^31. GCC leaves the plain loop scalar.
inline uint32_t stripe_hits(const float* x, int32_t t) {
  static_assert(kTopkStripe == 16);
#if defined(__SSE2__)
  const __m128i magnitude = _mm_set1_epi32(0x7fffffff), below = _mm_set1_epi32(t - 1);
  uint32_t mask = 0;
  for (int i = 0; i < 16; i += 4) {
    const __m128i bits = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)), magnitude);
    mask |= static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(bits, below)))) << i;
  }
  return mask;
#else
  uint32_t mask = 0;
  for (int i = 0; i < 16; ++i) mask |= uint32_t{static_cast<int32_t>(magnitude_bits(x[i])) >= t} << i;
  return mask;
#endif
}

// The used length of a bucket's position row: its slots up to the first kNoEntry.
int64_t used(const int32_t* positions, int64_t capacity) {
  int64_t n = 0;
  while (n < capacity && positions[n] != kNoEntry) ++n;
  return n;
}

// Positions [0, n) of a bucket must ascend within [0, limit): the merges below rely on it.
Status check_bucket(const int32_t* positions, int64_t n, int64_t limit, const char* what, int64_t index) {
  for (int64_t s = 0; s < n; ++s) {
    if (positions[s] < 0 || positions[s] >= limit || (s && positions[s] <= positions[s - 1]))
      return Status::Error(std::string("jaxcoll sparse all-reduce: ") + what + " " + std::to_string(index) +
                           " has position " + std::to_string(positions[s]) + " in slot " + std::to_string(s) +
                           "; positions must ascend within [0, " + std::to_string(limit) + ")");
  }
  return Status();
}

// The same for a bucket of region p of x, whose positions must also name elements of x: the result and the
// residual write there.
Status check_bucket(const int32_t* positions, int64_t n, const TopkRegions& regions, int64_t p, const char* what) {
  if (Status st = check_bucket(positions, n, regions.region(), what, p); !st.ok()) return st;
  if (n && regions.element(p, positions[n - 1]) >= regions.elements)
    return Status::Error(std::string("jaxcoll sparse all-reduce: ") + what + " " + std::to_string(p) +
                         " has position " + std::to_string(positions[n - 1]) + ", past x's " +
                         std::to_string(regions.elements) + " elements");
  return Status();
}

struct Candidate {
  int32_t position;
  uint32_t bits;  // the float32 value's or sum's bits
};

// The stages' scratch, kept by each thread across calls: O(k) slots each, but a fresh allocation of that size
// faults in page by page, which took half the owner's stage's time (2.4 of 4.7 ms of CPU at 64 MiB a rank, 1%).
struct Scratch {
  std::vector<Candidate> entries, sorted, sums;
  std::vector<uint32_t> sample, magnitudes;
};
thread_local Scratch scratch;

// The rank-th largest (1-based) of `values` (each below 2^31): a most-significant-digit radix select, three
// passes that count the digits of bits 30-20, 19-9 and 8-0 among the values that share the digits found so far.
uint32_t kth_largest(const std::vector<uint32_t>& values, int64_t rank) {
  constexpr std::array<std::pair<int, int>, 3> kDigits = {{{20, 11}, {9, 11}, {0, 9}}};  // (shift, width)
  std::array<int64_t, 1 << 11> count;
  uint32_t prefix = 0, fixed = 0;  // the value's bits found so far, and which bits those are
  for (const auto& [shift, width] : kDigits) {
    const uint32_t digit_mask = (1u << width) - 1;
    count.fill(0);
    for (uint32_t v : values)
      if ((v & fixed) == prefix) ++count[(v >> shift) & digit_mask];
    for (int64_t d = digit_mask; d >= 0; --d) {
      if (rank <= count[d]) {
        prefix |= static_cast<uint32_t>(d) << shift;
        fixed |= digit_mask << shift;
        break;
      }
      rank -= count[d];
    }
  }
  return prefix;
}

// Sorts `entries` by position (all below `limit`), stably: an LSD radix sort, 11 bits a pass; `spare` is scratch.
void sort_by_position(std::vector<Candidate>& entries, std::vector<Candidate>& spare, int64_t limit) {
  constexpr int kDigitBits = 11;
  std::array<int64_t, (1 << kDigitBits) + 1> offsets;
  spare.resize(entries.size());
  for (int shift = 0; (limit - 1) >> shift; shift += kDigitBits) {
    offsets.fill(0);
    const auto digit = [shift](const Candidate& e) { return (e.position >> shift) & ((1 << kDigitBits) - 1); };
    for (const Candidate& e : entries) ++offsets[digit(e) + 1];
    for (size_t d = 1; d < offsets.size(); ++d) offsets[d] += offsets[d - 1];
    for (const Candidate& e : entries) spare[offsets[digit(e)]++] = e;
    std::swap(entries, spare);
  }
}

}  // namespace

uint32_t topk_threshold(const float* x, int64_t elements, int64_t k, float floor) {
  const int64_t samples = std::min(elements, kTopkSample);
  std::vector<uint32_t>& sample = scratch.sample;
  sample.resize(samples);
  // Runs of kTopkSampleRun consecutive elements, run r from element floor(r L / (S / run)): a few cache lines each
  // rather than one per sample (strided samples cost half as much as the selection pass at 16 MiB a rank).
  if (elements <= kTopkSample) {
    for (int64_t i = 0; i < elements; ++i) sample[i] = magnitude_bits(x[i]);
  } else {
    const int64_t runs = kTopkSample / kTopkSampleRun;
    for (int64_t r = 0; r < runs; ++r) {
      const float* run = x + r * elements / runs;
      for (int64_t i = 0; i < kTopkSampleRun; ++i) sample[r * kTopkSampleRun + i] = magnitude_bits(run[i]);
    }
  }
  const int64_t rank = (k * samples + elements - 1) / elements;  // k_s in [1, samples] for k in [1, elements]
  uint32_t t = kth_largest(sample, rank);
  t = std::max({t, 1u, magnitude_bits(floor)});
  return std::min(t, kInfBits);
}

void topk_select(const float* x, const TopkRegions& regions, uint32_t threshold, int64_t capacity,
                 int32_t* buckets) {
  const auto t = static_cast<int32_t>(threshold);  // below 2^31: compared with |x| bits as int32
  const int64_t n = regions.nranks, elements = regions.elements;
  std::vector<int64_t> count(n, 0);
  // Most stripes hold no entry that reaches the threshold (at 1%, 85% of them): test a stripe at once and look
  // at its entries only when one does. Stripe j's region p = j mod N and first position base = (j / N) B are
  // counted along rather than divided.
  int64_t p = 0, base = 0;
  for (int64_t start = 0; start < elements; start += kTopkStripe, p = p + 1 == n ? 0 : p + 1,
               base += p ? 0 : kTopkStripe) {
    const int64_t stop = std::min(elements, start + kTopkStripe);
    if (count[p] == capacity) continue;
    int32_t* positions = buckets + p * 2 * capacity;
    auto take = [&](int64_t i) {
      positions[count[p]] = static_cast<int32_t>(base + (i - start));
      positions[capacity + count[p]] = std::bit_cast<int32_t>(x[i]);
      ++count[p];
    };
    if (stop - start == kTopkStripe) {
      // Only the entries whose bits are set: at 1% a stripe that has one mostly has one.
      for (uint32_t hits = stripe_hits(x + start, t); hits && count[p] < capacity; hits &= hits - 1)
        take(start + std::countr_zero(hits));
    } else {
      for (int64_t i = start; i < stop && count[p] < capacity; ++i)
        if (static_cast<int32_t>(magnitude_bits(x[i])) >= t) take(i);
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    int32_t* positions = buckets + r * 2 * capacity;
    std::fill(positions + count[r], positions + capacity, kNoEntry);
    std::fill(positions + capacity + count[r], positions + 2 * capacity, 0);
  }
}

Status topk_reduce(const int32_t* received, int64_t nranks, int64_t capacity, int64_t region, int64_t kept,
                   int32_t* out) {
  std::vector<const int32_t*> positions(nranks), values(nranks);
  std::vector<int64_t> length(nranks);
  int64_t total = 0;
  for (int64_t p = 0; p < nranks; ++p) {
    positions[p] = received + p * 2 * capacity;
    values[p] = positions[p] + capacity;
    length[p] = used(positions[p], capacity);
    if (Status st = check_bucket(positions[p], length[p], region, "the bucket received from rank", p); !st.ok())
      return st;
    total += length[p];
  }
  // Every rank's entries, in rank order, sorted by position with a stable LSD radix sort: the entries of one
  // position stay in rank order, so adding each run from 0 gives the sum a dense scatter-add in rank order would,
  // without a region-sized buffer, in a few passes over the O(k) received slots (N - 1 two-way merges made
  // N / 2 passes).
  std::vector<Candidate>& entries = scratch.entries;
  entries.clear();
  entries.reserve(total);
  for (int64_t p = 0; p < nranks; ++p)
    for (int64_t j = 0; j < length[p]; ++j)
      entries.push_back({positions[p][j], static_cast<uint32_t>(values[p][j])});
  sort_by_position(entries, scratch.sorted, region);
  std::vector<Candidate>& sums = scratch.sums;  // position order
  sums.clear();
  sums.reserve(entries.size());
  for (size_t i = 0; i < entries.size();) {
    float sum = 0.0f;
    const int32_t position = entries[i].position;
    for (; i < entries.size() && entries[i].position == position; ++i) sum += std::bit_cast<float>(entries[i].bits);
    sums.push_back({position, std::bit_cast<uint32_t>(sum)});
  }
  if (kept == 0) {
    sums.clear();
  } else if (static_cast<int64_t>(sums.size()) > kept) {
    // The kept-th largest magnitude m: every sum above m is kept, and of those at m the first in position order.
    std::vector<uint32_t>& magnitudes = scratch.magnitudes;
    magnitudes.resize(sums.size());
    for (size_t i = 0; i < sums.size(); ++i) magnitudes[i] = sums[i].bits & 0x7fffffffu;
    const uint32_t m = kth_largest(magnitudes, kept);
    int64_t at_m = kept - std::count_if(magnitudes.begin(), magnitudes.end(), [m](uint32_t v) { return v > m; });
    size_t n = 0;
    for (size_t i = 0; i < sums.size(); ++i)
      if (magnitudes[i] > m || (magnitudes[i] == m && at_m-- > 0)) sums[n++] = sums[i];
    sums.resize(n);
  }
  int32_t* out_values = out + kept;
  const int64_t n = static_cast<int64_t>(sums.size());
  for (int64_t s = 0; s < n; ++s) {
    out[s] = sums[s].position;
    out_values[s] = static_cast<int32_t>(sums[s].bits);
  }
  std::fill(out + n, out + kept, kNoEntry);
  std::fill(out_values + n, out_values + kept, 0);
  return Status();
}

Status topk_result(const int32_t* gathered, const TopkRegions& regions, int64_t kept, float* out) {
  // A fresh output of XLA's faults in 4 KiB pages, which costs more than the writing (csrc/memory.hpp).
  advise_huge_pages(out, sizeof(float) * regions.elements);
  std::memset(out, 0, sizeof(float) * regions.elements);
  for (int64_t p = 0; p < regions.nranks; ++p) {
    const int32_t* positions = gathered + p * 2 * kept;
    const int32_t* values = positions + kept;
    const int64_t n = used(positions, kept);
    if (Status st = check_bucket(positions, n, regions, p, "the bucket gathered from owner"); !st.ok()) return st;
    for (int64_t s = 0; s < n; ++s) out[regions.element(p, positions[s])] = std::bit_cast<float>(values[s]);
  }
  return Status();
}

Status topk_residual(const float* x, const int32_t* sent, int64_t capacity, const int32_t* gathered, int64_t kept,
                     const TopkRegions& regions, float* residual) {
  if (residual != x) {
    advise_huge_pages(residual, sizeof(float) * regions.elements);
    std::memcpy(residual, x, sizeof(float) * regions.elements);
  }
  for (int64_t p = 0; p < regions.nranks; ++p) {
    const int32_t* mine = sent + p * 2 * capacity;
    const int32_t* owners = gathered + p * 2 * kept;
    const int64_t n_mine = used(mine, capacity), n_owners = used(owners, kept);
    if (Status st = check_bucket(mine, n_mine, regions, p, "this rank's bucket for region"); !st.ok()) return st;
    if (Status st = check_bucket(owners, n_owners, regions, p, "the bucket gathered from owner"); !st.ok()) return st;
    for (int64_t i = 0, j = 0; i < n_mine && j < n_owners;) {  // both ascend: intersect by merging
      if (mine[i] < owners[j]) {
        ++i;
      } else if (owners[j] < mine[i]) {
        ++j;
      } else {
        residual[regions.element(p, mine[i])] = 0.0f;
        ++i;
        ++j;
      }
    }
  }
  return Status();
}

}  // namespace jaxcoll
