// The XLA FFI handlers of the codec (csrc/codec.hpp): stateless, execute stage only, registered for platform
// "cpu" under the names of csrc/abi.hpp's kCodecTargets. Operands and attributes: jaxcoll/compress/codec.py.
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* JaxcollCodecEncode(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxcollCodecDecode(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxcollCodecDecodeSum(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxcollCodecDecodeSumEncode(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxcollCodecEncodeWire(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxcollCodecDecodeSumWire(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxcollCodecDecodeSumEncodeWire(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* JaxcollCodecDecodeWire(XLA_FFI_CallFrame* frame);
}
