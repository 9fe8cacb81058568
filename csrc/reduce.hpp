// The one data kernel of the CPU executor: reduce sources, in the order given, into an accumulator and write
// the result to every destination (docs/plan-ir.md, "Steps"). A single source is a copy; no sources is a zero
// fill. Each operand says whether its buffer holds the data type or the accumulation type (scratch).
#pragma once

#include <cstdint>

#include "csrc/abi.hpp"
#include "csrc/dtype.hpp"

namespace jaxcoll {

struct Operand {
  void* ptr;
  bool accum;  // the buffer holds the accumulation type (scratch), not the data type
};

// Sources and destinations may coincide element for element (dst <- dst (+) src) but must not otherwise
// overlap. `n` is the element count of every operand. With `stream`, destinations of at least JAXCOLL_NT_BYTES
// are written with non-temporal stores (see `stream_call`).
void reduce_chunks(DType dtype, ReduceOp op, const Operand* srcs, int nsrc, const Operand* dsts, int ndst, int64_t n,
                   bool stream);

// Whether a call that reads and writes `traffic_bytes` in all (every rank's data steps together) should write
// its large destinations with non-temporal stores: only when it moves more than the caches hold
// (JAXCOLL_NT_CALL_BYTES).
bool stream_call(int64_t traffic_bytes);

}  // namespace jaxcoll
