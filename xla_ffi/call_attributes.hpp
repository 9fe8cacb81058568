// The attributes of every jaxcoll custom call (docs/plan-ir.md, "The custom call"), bound in one order by each
// handler stage that reads them, CPU and CUDA alike.
#pragma once

#include <cstdint>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace jaxcoll {

// `binding` (an XLA FFI binding of any stage) with the call's attributes appended: plan, reduce_op, callsite,
// processes, which the handler function takes after its operands and result.
template <typename Binding>
auto bind_call_attributes(Binding&& binding) {
  namespace ffi = xla::ffi;
  return std::forward<Binding>(binding)
      .template Attr<ffi::Span<const int32_t>>("plan")
      .template Attr<int32_t>("reduce_op")
      .template Attr<int64_t>("callsite")
      .template Attr<ffi::Span<const int32_t>>("processes");
}

}  // namespace jaxcoll
