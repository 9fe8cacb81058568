// What each collective means to the runtimes, one entry a collective: its wire code, name, block counts as
// functions of the group size, how an in-place plan aliases its buffers, whether it applies the call's reduction
// and whether each plan states its meaning (custom). jaxcoll/plan/collectives.py is the table; this is its
// mirror for C++, less what only Python reads (the postcondition, the parameters root and perm, the MSCCL and
// MSCCL++ names). The native module reports it (`_jaxcoll.abi()["collectives"]`) and
// tests/test_collectives_table.py holds the two together; docs/plan-ir.md, "Adding a collective", says where an
// entry goes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace jaxcoll {

// The wire codes of jaxcoll.plan.collectives: written into every compiled program, never renumber.
enum class Collective : int32_t {
  kAllReduce = 0,
  kAllGather = 1,
  kReduceScatter = 2,
  kAllToAll = 3,
  kBroadcast = 4,
  kPpermute = 5,
  kCustom = 6,
};
inline constexpr int32_t kNumCollectives = 7;

// How an in-place plan (MSCCL's meaning) lays its input and output in one memory; the names are Python's
// (jaxcoll.plan.collectives.InPlace).
enum class InPlace : int32_t {
  kSame,           // input and output are the same buffer
  kInputInOutput,  // rank r's input is block r of its output (all_gather)
  kOutputInInput,  // rank r's output is block r of its input (reduce_scatter)
};
inline constexpr std::array<const char*, 3> kInPlaceNames = {"same", "input_in_output", "output_in_input"};

struct CollectiveInfo {
  Collective collective;
  const char* name;                      // the plan IR's (jaxcoll.plan.Collective's value)
  int32_t (*in_blocks)(int32_t nranks);  // input blocks of a rank in a group of nranks
  int32_t (*out_blocks)(int32_t nranks);
  InPlace in_place;
  bool reduces;      // applies the call's reduction (reduce_op) to its inputs (custom: its steps may)
  bool plan_states;  // each plan states its own meaning and blocks (custom): the collective has none of its own
};

inline constexpr int32_t one_block(int32_t) { return 1; }
inline constexpr int32_t block_per_rank(int32_t nranks) { return nranks; }

// In the order of the codes: kCollectives[code] is the entry of that code (checked below).
inline constexpr std::array<CollectiveInfo, kNumCollectives> kCollectives = {{
    {Collective::kAllReduce, "all_reduce", one_block, one_block, InPlace::kSame, true, false},
    {Collective::kAllGather, "all_gather", one_block, block_per_rank, InPlace::kInputInOutput, false, false},
    {Collective::kReduceScatter, "reduce_scatter", block_per_rank, one_block, InPlace::kOutputInInput, true, false},
    {Collective::kAllToAll, "all_to_all", block_per_rank, block_per_rank, InPlace::kSame, false, false},
    {Collective::kBroadcast, "broadcast", one_block, one_block, InPlace::kSame, false, false},
    {Collective::kPpermute, "ppermute", one_block, one_block, InPlace::kSame, false, false},
    {Collective::kCustom, "custom", one_block, one_block, InPlace::kSame, true, true},
}};

consteval bool entries_sit_at_their_codes() {
  for (int32_t code = 0; code < kNumCollectives; ++code)
    if (static_cast<int32_t>(kCollectives[code].collective) != code) return false;
  return true;
}
static_assert(entries_sit_at_their_codes(), "kCollectives must list the collectives in the order of their codes");

// The collective of a wire code, or nothing for a code outside the table.
inline std::optional<Collective> collective_from_code(int32_t code) {
  if (code < 0 || code >= kNumCollectives) return std::nullopt;
  return static_cast<Collective>(code);
}

// A decoded plan's collective always has an entry (decode_plan refuses other codes).
inline const CollectiveInfo& collective_info(Collective c) { return kCollectives[static_cast<size_t>(c)]; }

inline const char* collective_name(Collective c) {
  const auto code = static_cast<int32_t>(c);
  return code >= 0 && code < kNumCollectives ? kCollectives[code].name : "?";
}

}  // namespace jaxcoll
