#include "csrc/cuda/device_group.hpp"

#include "csrc/cuda/cuda_status.hpp"
#include "csrc/cuda/ipc.hpp"
#include "csrc/cuda/slot_exchange.hpp"
#include "csrc/cross_process.hpp"
#include "csrc/world.hpp"

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
  uint64_t fingerprint = 0;          // plan, reduction and shape: what every process of the group must agree on
  std::vector<int32_t> processes;    // per rank: the job process hosting it; empty when every rank is here
  int32_t me = 0;                    // this process
  std::vector<int> device_of_rank;   // -1 until the rank joins (and for ranks of other processes)
  std::vector<DeviceMemory> slots;   // the slots of this process's ranks
  std::vector<PeerMapping> mappings; // other processes' slots, mapped into this process's GPUs (CUDA IPC)
  std::unique_ptr<ErrorRecordMemory> error;  // in-process groups: pinned host memory
  std::unique_ptr<SlotExchange> exchange;    // groups spanning processes: the peers, and the shared error record
  ErrorRecord* record = nullptr;
  std::vector<std::unique_ptr<Launcher>> launchers;  // per rank; null for ranks of other processes
  std::vector<GroupMember> members;
  bool ready = false;
  bool setting_up = false;
  Status failed;  // setup failed: every joiner reports it

  bool local(int32_t r) const { return processes.empty() || processes[r] == me; }
  bool spanning() const { return !processes.empty(); }
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

std::string pci_bus_id(int device) {
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) != cudaSuccess) {
    cudaGetLastError();
    return "device " + std::to_string(device) + " of process " + std::to_string(world() ? world()->process : 0);
  }
  return bus;
}

// Runs on the thread of the last local rank to join, outside the registry lock (a group spanning processes
// waits here for its peers): the one thread that sets the group up in this process.
Status set_up(DeviceGroup& g, int64_t callsite, int32_t group, double timeout_s) {
  std::vector<int32_t> local;
  for (int32_t r = 0; r < g.plan.nranks; ++r)
    if (g.local(r)) local.push_back(r);
  std::vector<int> devices;
  for (size_t a = 0; a < local.size(); ++a) {
    devices.push_back(g.device_of_rank[local[a]]);
    for (size_t b = a + 1; b < local.size(); ++b)
      if (g.device_of_rank[local[a]] == g.device_of_rank[local[b]])
        return Status::Error("ranks " + std::to_string(local[a]) + " and " + std::to_string(local[b]) +
                             " run on the same GPU " + std::to_string(g.device_of_rank[local[a]]) +
                             "; each rank of a group needs its own GPU");
  }
  if (Status st = enable_peer_access(devices); !st.ok()) return st;
  if (Status st = build_plan_image(g.plan, g.image); !st.ok()) return st;
  const int64_t in_bytes = g.shape.input_elements * int64_t(dtype_size(g.shape.dtype));
  Protocol protocol;
  if (Status st = choose_protocol(g.image, in_bytes, ll_max_bytes(), protocol); !st.ok()) return st;
  int blocks = 1 << 30;  // the fewest any device allows: waits count the blocks of every rank alike
  for (int device : devices) {
    int b = 0;
    if (Status st = choose_blocks_per_lane(g.image, g.shape, device, 1, protocol, b); !st.ok()) return st;
    blocks = std::min(blocks, b);
  }
  g.layout = slot_layout(g.image, g.shape, protocol, /*staged=*/g.spanning());
  std::vector<char*> own(g.plan.nranks, nullptr);  // unified addressing: the same address on every local GPU
  for (int32_t r : local) {
    DeviceMemory m;
    if (Status st = DeviceMemory::allocate(g.device_of_rank[r], size_t(g.layout.bytes), m); !st.ok()) return st;
    own[r] = m.get();
    g.slots.push_back(std::move(m));
  }
  if (g.spanning()) {
    // Peers in other processes reach this process's slots through CUDA IPC handles, which travel in the
    // host's shared memory (slot_exchange.hpp); the kernel's bulk protocol then stages XLA's buffers in the slot.
    SlotOffer offer;
    offer.fingerprint = g.fingerprint;
    offer.protocol = static_cast<int32_t>(protocol);
    offer.most_blocks = blocks;
    for (size_t i = 0; i < local.size(); ++i) {
      IpcHandle h;
      if (Status st = export_ipc_handle(g.slots[i], h); !st.ok()) return st;
      offer.ranks.push_back(local[i]);
      offer.slots.push_back(h);
      offer.buses.push_back(pci_bus_id(g.device_of_rank[local[i]]));
    }
    if (Status st = SlotExchange::exchange(callsite, group, g.processes, offer, timeout_s, g.exchange); !st.ok())
      return st;
    blocks = g.exchange->blocks();
    g.record = g.exchange->error_record();
  } else {
    if (Status st = ErrorRecordMemory::allocate(g.error); !st.ok()) return st;
    g.record = g.error->get();
  }
  g.launchers.resize(g.plan.nranks);
  for (int32_t r : local) {
    const int device = g.device_of_rank[r];
    std::vector<char*> slot_table = own;
    for (int32_t q = 0; q < g.plan.nranks; ++q) {
      if (g.local(q)) continue;
      // "cudaIpcMemHandles ... may only be opened by one context per device per other process": one mapping
      // per (local GPU, peer rank), each in the slot table of the rank launched on that GPU.
      PeerMapping m;
      if (Status st = PeerMapping::open(g.exchange->slot(q), device, m); !st.ok())
        return Status::Error("mapping rank " + std::to_string(q) + "'s slot (" +
                             g.exchange->describe_process(g.processes[q]) + ") into GPU " + std::to_string(device) +
                             ": " + st.message());
      slot_table[q] = m.get();
      g.mappings.push_back(std::move(m));
    }
    Launcher::Options o;
    o.device = device;
    o.first_rank = r;
    o.launch_ranks = 1;
    o.protocol = protocol;
    o.blocks_per_lane = blocks;
    o.timeout_s = timeout_s;
    o.staged = g.spanning();
    o.one_device = g.plan.nranks == 1;  // every rank has a GPU of its own: peers are other GPUs
    o.callsite = callsite;
    o.group = group;
    if (Status st = Launcher::create(g.plan, g.image, g.shape, g.layout, slot_table, g.record, o, g.launchers[r]);
        !st.ok())
      return st;
  }
  g.members.resize(g.plan.nranks);
  for (int32_t r : local) g.members[r] = {&g, r, g.launchers[r].get(), g.shape};
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
                  std::span<const int32_t> processes, CallShape shape, double timeout_s, GroupMember*& out) {
  const std::string site = "callsite " + std::to_string(callsite) + ", group " + std::to_string(group);
  std::unique_lock<std::mutex> lock(registry_mutex);
  if (auto it = members.find({callsite, device}); it != members.end()) {
    out = it->second;
    return {};
  }
  std::unique_ptr<DeviceGroup>& slot = groups[{callsite, group}];
  if (!slot) {
    auto g = std::make_unique<DeviceGroup>();
    if (Status st = decode_plan(words, g->plan); !st.ok())
      return Status::Error(site + ": the custom call's plan attribute is malformed: " + st.message());
    if (Status st = check_shape(g->plan, shape); !st.ok()) return Status::Error(site + ": " + st.message());
    g->shape = shape;
    g->device_of_rank.assign(g->plan.nranks, -1);
    if (!processes.empty()) {
      const World* w = world();
      if (processes.size() != size_t(g->plan.nranks))
        return Status::Error(site + ": the process map names " + std::to_string(processes.size()) +
                             " ranks, the plan has " + std::to_string(g->plan.nranks));
      g->me = w ? w->process : 0;
      g->processes.assign(processes.begin(), processes.end());
      if (std::count(g->processes.begin(), g->processes.end(), g->me) == 0)
        return Status::Error(site + ": no rank of this group is hosted by process " + std::to_string(g->me));
    }
    // What every process of a spanning group must agree on: the plan, the reduction and the shape.
    uint64_t f = plan_fingerprint(words.data(), words.size(), static_cast<int32_t>(shape.op));
    for (uint64_t v : {uint64_t(shape.dtype), uint64_t(shape.input_elements), uint64_t(shape.output_elements)})
      f = (f ^ v) * 1099511628211ull;
    g->fingerprint = f;
    slot = std::move(g);
  }
  DeviceGroup& g = *slot;
  if (!g.failed.ok()) return g.failed;
  if (rank < 0 || rank >= g.plan.nranks)
    return Status::Error(site + ": rank operand " + std::to_string(rank) + " is out of range for a plan of " +
                         std::to_string(g.plan.nranks) + " ranks");
  if (!g.local(rank))
    return Status::Error(site + ": rank " + std::to_string(rank) + " joined from GPU " + std::to_string(device) +
                         " of process " + std::to_string(g.me) + ", but the plan's process map puts it in process " +
                         std::to_string(g.processes[rank]));
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
  int32_t missing = 0;
  for (int32_t r = 0; r < g.plan.nranks; ++r) missing += g.local(r) && g.device_of_rank[r] < 0;
  if (missing == 0 && !g.ready && !g.setting_up) {
    // Set up without the registry lock: a spanning group waits here for other processes, and this process's
    // other groups must still be able to join meanwhile.
    g.setting_up = true;
    lock.unlock();
    Status st = set_up(g, callsite, group, timeout_s);
    lock.lock();
    g.setting_up = false;
    if (!st.ok()) {
      g.failed = Status::Error(site + ": setting up the group failed: " + st.message());
      joined.notify_all();
      return g.failed;
    }
    for (int32_t r = 0; r < g.plan.nranks; ++r)
      if (g.local(r)) members[{callsite, g.device_of_rank[r]}] = &g.members[r];
    g.ready = true;
    joined.notify_all();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  if (!joined.wait_until(lock, deadline, [&] { return g.ready || !g.failed.ok(); })) {
    std::string absent;
    for (int32_t r = 0; r < g.plan.nranks; ++r)
      if (g.local(r) && g.device_of_rank[r] < 0) absent += (absent.empty() ? "" : ", ") + std::to_string(r);
    return Status::Error(site + ": ranks [" + absent + "] of this process never joined within " +
                         std::to_string(timeout_s) + " s (timeout set by JAXCOLL_TIMEOUT). Every rank of a group must "
                         "run the call, each on its own GPU");
  }
  if (!g.failed.ok()) return g.failed;
  out = &g.members[rank];
  return {};
}

std::string group_failure(const DeviceGroup& g) {
  if (!g.record || __atomic_load_n(&g.record->code, __ATOMIC_ACQUIRE) == 0) return {};
  const ErrorRecord& rec = *g.record;
  const Launcher* any = nullptr;
  for (const auto& l : g.launchers)
    if (l) any = l.get();
  if (!any) return "the group failed before any rank of this process was set up";
  const std::string head = std::string(collective_name(g.plan.collective)) + " on the CUDA executor: ";
  if (static_cast<Failure>(rec.code) == Failure::kProcessGone && g.exchange)
    return head + g.exchange->describe_process(rec.peer) + " has exited (or was killed) while this group ran; its "
           "peers cannot complete the call: restart the job";
  if (static_cast<Failure>(rec.code) == Failure::kPeerFailed && g.exchange)
    return head + g.exchange->describe_process(rec.peer) + " failed to set up this group: " +
           g.exchange->peer_failure(rec.peer);
  std::string what = any->describe_failure(rec);
  if (g.exchange && rec.rank >= 0 && rec.rank < g.plan.nranks)
    what += "; rank " + std::to_string(rec.rank) + " runs in " + g.exchange->describe_process(g.processes[rec.rank]);
  return what;
}

}  // namespace jaxcoll::cuda
