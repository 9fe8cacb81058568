#include "csrc/cuda/device_group.hpp"

#include "csrc/cuda/cuda_status.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

namespace jaxcoll::cuda {

class DeviceGroup {
 public:
  Plan plan;
  PlanImage image;
  CallShape shape;
  SlotLayout layout;
  std::vector<int> device_of_rank;
  std::vector<DeviceMemory> slots;
  std::unique_ptr<ErrorRecordMemory> error;
  std::vector<std::unique_ptr<Launcher>> launchers;
  std::vector<GroupMember> members;
  bool ready = false;
  Status failed;  // setup failed: every joiner reports it
};

namespace {

std::mutex registry_mutex;
std::condition_variable joined;
std::map<std::pair<int64_t, int32_t>, std::unique_ptr<DeviceGroup>> groups;  // (callsite, group)
std::map<std::pair<int64_t, int>, GroupMember*> members;                     // (callsite, device)

// Every device of the group reaches every other's memory (slots, and in the bulk protocol XLA's buffers).
Status enable_peer_access(const std::vector<int>& devices) {
  int previous = 0;
  cudaGetDevice(&previous);
  Status st;
  for (int a : devices) {
    for (int b : devices) {
      if (a == b || !st.ok()) continue;
      int can = 0;
      if (cudaError_t err = cudaDeviceCanAccessPeer(&can, a, b); err != cudaSuccess) {
        st = cuda_error(err, "cudaDeviceCanAccessPeer");
      } else if (!can) {
        st = Status::Error("GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b) +
                           "'s memory (no peer-to-peer path); the CUDA executor needs peer access between the GPUs "
                           "of a group");
      } else {
        cudaSetDevice(a);
        const cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else if (err != cudaSuccess) st = cuda_error(err, "cudaDeviceEnablePeerAccess");
      }
    }
  }
  cudaSetDevice(previous);
  return st;
}

// Runs on the thread of the last rank to join, with the registry locked: the one thread that sets up.
Status set_up(DeviceGroup& g, double timeout_s) {
  for (size_t a = 0; a < g.device_of_rank.size(); ++a)
    for (size_t b = a + 1; b < g.device_of_rank.size(); ++b)
      if (g.device_of_rank[a] == g.device_of_rank[b])
        return Status::Error("ranks " + std::to_string(a) + " and " + std::to_string(b) + " run on the same GPU " +
                             std::to_string(g.device_of_rank[a]) + "; each rank of a group needs its own GPU");
  if (Status st = enable_peer_access(g.device_of_rank); !st.ok()) return st;
  if (Status st = build_plan_image(g.plan, g.image); !st.ok()) return st;
  const int64_t in_bytes = g.shape.input_elements * int64_t(dtype_size(g.shape.dtype));
  Protocol protocol;
  if (Status st = choose_protocol(g.image, in_bytes, ll_max_bytes(), protocol); !st.ok()) return st;
  int blocks = 1 << 30;  // the fewest any device allows: waits count the blocks of every rank alike
  for (int device : g.device_of_rank) {
    int b = 0;
    if (Status st = choose_blocks_per_lane(g.image, g.shape, device, 1, protocol, b); !st.ok()) return st;
    blocks = std::min(blocks, b);
  }
  g.layout = slot_layout(g.image, g.shape, protocol);
  std::vector<char*> slot_table;
  for (int device : g.device_of_rank) {
    DeviceMemory m;
    if (Status st = DeviceMemory::allocate(device, size_t(g.layout.bytes), m); !st.ok()) return st;
    slot_table.push_back(m.get());  // unified addressing: the same address on every peer
    g.slots.push_back(std::move(m));
  }
  if (Status st = ErrorRecordMemory::allocate(g.error); !st.ok()) return st;
  for (int32_t r = 0; r < g.plan.nranks; ++r) {
    Launcher::Options o;
    o.device = g.device_of_rank[r];
    o.first_rank = r;
    o.launch_ranks = 1;
    o.protocol = protocol;
    o.blocks_per_lane = blocks;
    o.timeout_s = timeout_s;
    std::unique_ptr<Launcher> l;
    if (Status st = Launcher::create(g.plan, g.image, g.shape, g.layout, slot_table, g.error->get(), o, l); !st.ok())
      return st;
    g.launchers.push_back(std::move(l));
  }
  g.members.resize(g.plan.nranks);
  for (int32_t r = 0; r < g.plan.nranks; ++r) g.members[r] = {&g, r, g.launchers[r].get(), g.shape};
  return {};
}

bool same_shape(const CallShape& a, const CallShape& b) {
  return a.dtype == b.dtype && a.op == b.op && a.input_elements == b.input_elements &&
         a.output_elements == b.output_elements;
}

}  // namespace

GroupMember* find_member(int64_t callsite, int device) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = members.find({callsite, device});
  return it == members.end() ? nullptr : it->second;
}

Status join_group(int64_t callsite, int32_t group, int32_t rank, int device, std::span<const int32_t> words,
                  CallShape shape, double timeout_s, GroupMember*& out) {
  const std::string site = "callsite " + std::to_string(callsite) + ", group " + std::to_string(group);
  std::unique_lock<std::mutex> lock(registry_mutex);
  if (auto it = members.find({callsite, device}); it != members.end()) {
    out = it->second;
    return {};
  }
  std::unique_ptr<DeviceGroup>& slot = groups[{callsite, group}];
  if (!slot) {
    slot = std::make_unique<DeviceGroup>();
    if (Status st = decode_plan(words, slot->plan); !st.ok())
      return Status::Error(site + ": the custom call's plan attribute is malformed: " + st.message());
    if (Status st = check_shape(slot->plan, shape); !st.ok()) return Status::Error(site + ": " + st.message());
    slot->shape = shape;
    slot->device_of_rank.assign(slot->plan.nranks, -1);
  }
  DeviceGroup& g = *slot;
  if (!g.failed.ok()) return g.failed;
  if (rank < 0 || rank >= g.plan.nranks)
    return Status::Error(site + ": rank operand " + std::to_string(rank) + " is out of range for a plan of " +
                         std::to_string(g.plan.nranks) + " ranks");
  CallShape mine = shape;
  mine.block = g.shape.block;
  if (!same_shape(mine, g.shape))
    return Status::Error(site + ": rank " + std::to_string(rank) + " called with " +
                         std::to_string(shape.input_elements) + " elements of " + dtype_name(shape.dtype) +
                         ", another rank with " + std::to_string(g.shape.input_elements) + " of " +
                         dtype_name(g.shape.dtype) + "; every rank must pass the same shape");
  if (g.device_of_rank[rank] >= 0 && g.device_of_rank[rank] != device)
    return Status::Error(site + ": rank " + std::to_string(rank) + " joined from GPU " + std::to_string(device) +
                         " and from GPU " + std::to_string(g.device_of_rank[rank]));
  g.device_of_rank[rank] = device;
  const bool complete = std::count(g.device_of_rank.begin(), g.device_of_rank.end(), -1) == 0;
  if (complete && !g.ready) {
    if (Status st = set_up(g, timeout_s); !st.ok()) {
      g.failed = Status::Error(site + ": setting up the group failed: " + st.message());
      joined.notify_all();
      return g.failed;
    }
    for (int32_t r = 0; r < g.plan.nranks; ++r) members[{callsite, g.device_of_rank[r]}] = &g.members[r];
    g.ready = true;
    joined.notify_all();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  if (!joined.wait_until(lock, deadline, [&] { return g.ready || !g.failed.ok(); })) {
    const int have = int(g.plan.nranks - std::count(g.device_of_rank.begin(), g.device_of_rank.end(), -1));
    return Status::Error(site + ": only " + std::to_string(have) + " of " + std::to_string(g.plan.nranks) +
                         " ranks joined within " + std::to_string(timeout_s) + " s. Every rank of a group must run "
                         "in this process on its own GPU; groups spanning processes need the IPC path, which is "
                         "not implemented yet (docs/cuda.md)");
  }
  if (!g.failed.ok()) return g.failed;
  out = &g.members[rank];
  return {};
}

std::string group_failure(const DeviceGroup& g) {
  if (!g.error || !g.error->failed()) return {};
  return g.launchers.front()->describe_failure(*g.error->get());
}

}  // namespace jaxcoll::cuda
