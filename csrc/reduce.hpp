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

// Whether a call whose buffers hold `footprint_bytes` (every rank's inputs, outputs and scratch together) should
// write its large destinations with non-temporal stores: only when they outgrow the caches
// (JAXCOLL_NT_CALL_BYTES). Not its traffic: a plan that rereads its chunks moves more than it holds, and the
// synthesized direct all_gather of 256 KiB a rank (32 MiB moved, 18 MiB held) took 660 us a call streaming its
// writes out of the caches that held everything it read next, 422 us not (docs/benchmarks.md, section 6).
bool stream_call(int64_t footprint_bytes);

}  // namespace jaxcoll
