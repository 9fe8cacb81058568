// The one data kernel of the CPU executor: reduce sources, in the order given, into an accumulator and write
// the result to every destination (docs/plan-ir.md, "Steps"). A single source is a copy; no sources is a zero
// fill. Each operand says whether its buffer holds the data type or the accumulation type (scratch).
#pragma once

#include <cstdint>

#include "dtype.hpp"

namespace jaxcoll {

struct Operand {
  void* ptr;
  bool accum;  // the buffer holds the accumulation type (scratch), not the data type
};

// Sources and destinations may coincide element for element (dst <- dst (+) src) but must not otherwise
// overlap. `n` is the element count of every operand.
void reduce_chunks(DType dtype, ReduceOp op, const Operand* srcs, int nsrc, const Operand* dsts, int ndst, int64_t n);

}  // namespace jaxcoll
