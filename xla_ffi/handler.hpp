// The XLA FFI handler of every jaxcoll custom call (docs/plan-ir.md, "The custom call"). This folder is the
// only code that includes XLA's FFI headers; csrc/ stays free of them.
#pragma once

#include "xla/ffi/api/c_api.h"

namespace jaxcoll::xla_cpu {

// Instantiate: decode and validate the `plan` attribute once per compiled call, keep it as FFI state.
XLA_FFI_Error* instantiate(XLA_FFI_CallFrame* frame);
// Execute: run this rank's lanes of the decoded plan.
XLA_FFI_Error* execute(XLA_FFI_CallFrame* frame);

// The state type: XLA assigns its id when jaxcoll.runtime registers it (jax.ffi.register_ffi_type).
XLA_FFI_TypeId* state_type_id();
const XLA_FFI_TypeInfo* state_type_info();

}  // namespace jaxcoll::xla_cpu
