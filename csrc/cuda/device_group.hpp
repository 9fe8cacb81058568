// The groups of XLA's calls on this process's GPUs (docs/cuda.md, "Under XLA"). A call site's group forms the
// first time its ranks initialize: each device's thread reads its rank and group from the call's operands
// once (outside any CUDA graph capture), and the last rank to join sets up the whole group from its thread:
// peer access between the group's devices, one workspace slot per rank on its own device, the plan on every
// device, one error record for all. Later calls look their rank up by (call site, device ordinal): no host
// synchronisation and no allocation, so XLA may capture them into CUDA graphs. A group whose ranks live in
// several processes of one host sets up the same way in each process, for its own ranks, and maps the other
// processes' slots through CUDA IPC.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "csrc/cuda/launcher.hpp"

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

// Join rank `rank` of group `group` of `callsite` on `device` and wait until every rank of this process has joined
// and the group is set up (or `timeout_s` passes). `processes[r]`, when not empty, is the job process hosting
// rank r (a group spanning the processes of one host, docs/cuda.md): the last local rank then exchanges the
// slots with the other processes through CUDA IPC (slot_exchange.hpp). The plan words are decoded once per
// group. Safe to call again: a rank that already joined returns its member at once.
Status join_group(int64_t callsite, int32_t group, int32_t rank, int device, std::span<const int32_t> words,
                  std::span<const int32_t> processes, CallShape shape, double timeout_s, GroupMember*& out);

// The failure recorded by any rank's kernel in this group, or an empty string.
std::string group_failure(const DeviceGroup& group);

}  // namespace jaxcoll::cuda
