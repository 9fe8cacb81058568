// The custom call's binary interface (docs/plan-ir.md, "The custom call"): the reduction codes of the `reduce_op`
// attribute and the names of the FFI targets, spelled once for C++. jaxcoll/plan/abi.py spells the same table for
// Python; the native module reports this one (`_jaxcoll.abi()`) and tests/test_abi.py holds the two together.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "csrc/plan.hpp"

namespace jaxcoll {

// Codes are positions in jaxcoll.plan.ir.REDUCE_OPS: never renumber, compiled programs carry them.
enum class ReduceOp : int32_t { kSum = 0, kMax = 1, kMin = 2 };
inline constexpr int32_t kNumReduceOps = static_cast<int32_t>(ReduceOp::kMin) + 1;  // valid codes: 0 .. kNumReduceOps-1
inline constexpr std::array<const char*, kNumReduceOps> kReduceOpNames = {"sum", "max", "min"};

inline const char* reduce_op_name(ReduceOp op) {
  const auto code = static_cast<int32_t>(op);
  return code >= 0 && code < kNumReduceOps ? kReduceOpNames[code] : "?";
}

// The reduction of a `reduce_op` code, or nothing for a code outside the table.
inline std::optional<ReduceOp> reduce_op_from_code(int32_t code) {
  if (code < 0 || code >= kNumReduceOps) return std::nullopt;
  return static_cast<ReduceOp>(code);
}

// "0 (sum), 1 (max) or 2 (min)": the valid codes, for an error message about one that is not.
inline std::string reduce_op_codes() {
  std::string s;
  for (int32_t code = 0; code < kNumReduceOps; ++code) {
    if (code) s += code + 1 == kNumReduceOps ? " or " : ", ";
    s += std::to_string(code) + " (" + kReduceOpNames[code] + ")";
  }
  return s;
}

// The FFI target of a plan's collective: the prefix and the collective's name in the plan IR. Every collective
// has one, registered for each platform jaxcoll runs on (XLA resolves a custom call by its name and platform).
inline constexpr const char* kTargetPrefix = "jaxcoll_";

inline std::string ffi_target(Collective c) { return std::string(kTargetPrefix) + collective_name(c); }

// The network steps of a collective across GPU hosts (xla_ffi/cuda_network.hpp): one target, registered for
// XLA's CUDA platform only; its `collective` attribute is a Collective code.
inline constexpr const char* kNetworkTarget = "jaxcoll_network";

// The sparse all-reduce's local stages (csrc/topk.hpp, xla_ffi/sparse.cc), in the order of a call: select the
// buckets, the owner's sum and reselection, the dense result, the residual. Stateless; platform "cpu" only.
inline constexpr const char* kTopkSelectTarget = "jaxcoll_topk_select";
inline constexpr const char* kTopkReduceTarget = "jaxcoll_topk_reduce";
inline constexpr const char* kTopkResultTarget = "jaxcoll_topk_result";
inline constexpr const char* kTopkResidualTarget = "jaxcoll_topk_residual";
inline constexpr std::array<const char*, 4> kSparseTargets = {kTopkSelectTarget, kTopkReduceTarget,
                                                              kTopkResultTarget, kTopkResidualTarget};

// The codec of the quantized collectives (xla_ffi/codec_handlers.cc over csrc/codec.hpp): stateless kernels, registered
// for platform "cpu" only (other platforms run the jax.numpy formats). The codes' element type names the format.
inline constexpr const char* kCodecEncodeTarget = "jaxcoll_codec_encode";
inline constexpr const char* kCodecDecodeTarget = "jaxcoll_codec_decode";
inline constexpr const char* kCodecDecodeSumTarget = "jaxcoll_codec_decode_sum";
inline constexpr const char* kCodecDecodeSumEncodeTarget = "jaxcoll_codec_decode_sum_encode";
inline constexpr const char* kCodecEncodeWireTarget = "jaxcoll_codec_encode_wire";
inline constexpr const char* kCodecDecodeSumWireTarget = "jaxcoll_codec_decode_sum_wire";
inline constexpr const char* kCodecDecodeSumEncodeWireTarget = "jaxcoll_codec_decode_sum_encode_wire";
inline constexpr const char* kCodecDecodeWireTarget = "jaxcoll_codec_decode_wire";
inline constexpr std::array<const char*, 8> kCodecTargets = {
    kCodecEncodeTarget,     kCodecDecodeTarget,        kCodecDecodeSumTarget,           kCodecDecodeSumEncodeTarget,
    kCodecEncodeWireTarget, kCodecDecodeSumWireTarget, kCodecDecodeSumEncodeWireTarget, kCodecDecodeWireTarget};

// Every FFI target, in the order of the collectives' codes.
inline std::array<std::string, kNumCollectives> ffi_targets() {
  std::array<std::string, kNumCollectives> names;
  for (int32_t c = 0; c < kNumCollectives; ++c) names[c] = ffi_target(static_cast<Collective>(c));
  return names;
}

}  // namespace jaxcoll
