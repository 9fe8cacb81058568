// Where a plan's chunks lie in memory: the C++ twin of jaxcoll/plan/layout.py (docs/plan-ir.md, "Chunks and
// sizes"). A buffer is a row of blocks of `block` elements, each split into k chunks; chunk j of a block spans
// [floor(j*block/k), floor((j+1)*block/k)), so any element count works and chunks at the same position j have
// the same size in every buffer.
#pragma once

#include <cstdint>

namespace jaxcoll {

// First element of chunk `index` of a buffer whose blocks hold `block` elements split into `k` chunks.
inline int64_t chunk_start(int64_t k, int64_t block, int64_t index) {
  const int64_t b = index / k, j = index % k;
  return b * block + (j * block) / k;
}

struct ElementRange {
  int64_t start;
  int64_t stop;
  int64_t size() const { return stop - start; }
};

// Elements [start, stop) of chunks index .. index+count-1.
inline ElementRange chunk_range(int64_t k, int64_t block, int64_t index, int64_t count) {
  return {chunk_start(k, block, index), chunk_start(k, block, index + count)};
}

}  // namespace jaxcoll
