// The groups of XLA's calls on this process's GPUs (docs/cuda.md, "Under XLA"). A call site's group forms the
// first time its ranks initialize: each device's thread reads its rank and group from the call's operands
// once (outside any CUDA graph capture), and the last rank to join sets up the whole group from its thread:
// peer access between the group's devices, one workspace slot per rank on its own device, the plan on every
// device, one error record for all. Later calls look their rank up by (call site, device ordinal): no host
// synchronisation and no allocation, so XLA may capture them into CUDA graphs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "csrc/cuda/executor.hpp"

namespace jaxcoll::cuda {

class DeviceGroup;

// One rank of a group: what a call needs to launch.
struct GroupMember {
  DeviceGroup* group;
  int32_t rank;
  const Launcher* launcher;
  CallShape shape;
};

// The member for (callsite, device), or nullptr before it joined.
GroupMember* find_member(int64_t callsite, int device);

// Join rank `rank` of group `group` of `callsite` on `device` and wait until every rank has joined (or
// `timeout_s` passes: a group spanning processes never completes here, see docs/cuda.md). The plan words are
// decoded once per group. Safe to call again: a rank that already joined returns its member at once.
Status join_group(int64_t callsite, int32_t group, int32_t rank, int device, std::span<const int32_t> words,
                  CallShape shape, double timeout_s, GroupMember*& out);

// The failure recorded by any rank's kernel in this group, or an empty string.
std::string group_failure(const DeviceGroup& group);

}  // namespace jaxcoll::cuda
