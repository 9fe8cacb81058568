// The XLA FFI handler of every jaxcoll custom call on XLA's CUDA platform: the same targets, operands and
// attributes as the CPU handler (docs/plan-ir.md, "The custom call"), run by the CUDA executor (docs/cuda.md).
#pragma once

#include "xla/ffi/api/c_api.h"

namespace jaxcoll::xla_cuda {

// Instantiate (XLA:GPU runs it when it compiles the call, on the compiling thread): a call over a mesh of several
// processes needs the job's runtime set up (jaxcoll.distributed.connect), and it is, once.
XLA_FFI_Error* instantiate(XLA_FFI_CallFrame* frame);
// Initialize (XLA:GPU runs it before executing, outside any CUDA graph capture): on a device's first call of a
// call site, read its rank and group from the operands and join the group, which sets up the workspace.
XLA_FFI_Error* initialize(XLA_FFI_CallFrame* frame);
// Execute: enqueue the executor kernel on XLA's stream. No host synchronisation, no allocation: declared
// command-buffer compatible, so XLA may capture it into CUDA graphs.
XLA_FFI_Error* execute(XLA_FFI_CallFrame* frame);

}  // namespace jaxcoll::xla_cuda
