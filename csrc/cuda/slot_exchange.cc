#include "csrc/cuda/slot_exchange.hpp"

#include "csrc/cuda/cuda_status.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "csrc/cuda/plan_image.hpp"
#include "csrc/shared_memory.hpp"
#include "csrc/world.hpp"

namespace jaxcoll::cuda {

namespace {

constexpr uint64_t kOfferMagic = 0x314C4C4F43584A47ull;  // "GJXCOLL1"
constexpr size_t kPage = 4096;

struct OfferEntry {
  int32_t rank = -1;
  IpcHandle slot{};
  char bus[32] = {};  // "0000:3b:00.0": what tells two processes' GPUs apart (device ordinals are per process)
};

// The head of a process's offer segment; the page after it holds the group's error record (used in the segment
// of the group's first process only).
struct OfferHeader {
  uint64_t magic = kOfferMagic;
  uint64_t fingerprint = 0;
  int32_t process = 0;
  int32_t protocol = 0;
  int32_t most_blocks = 0;
  int32_t nranks = 0;  // entries used
  OfferEntry entries[kMaxRanks];
  std::atomic<uint32_t> ready{0};   // set (release) once the fields above are written
  std::atomic<uint32_t> failed{0};  // set (release) when this process's setup failed after publishing: `message`
  char message[512] = {};
};

constexpr size_t kRecordOffset = (sizeof(OfferHeader) + kPage - 1) / kPage * kPage;
constexpr size_t kSegmentBytes = kRecordOffset + kPage;
static_assert(sizeof(ErrorRecord) <= kPage);

std::string offer_name(const World& w, int32_t process, int64_t callsite, int32_t group) {
  return w.segment_prefix(process) + "gpu-c" + std::to_string(callsite) + "g" +
         std::to_string(group);
}

std::string rank_list(const std::vector<int32_t>& ranks) {
  std::string s;
  for (int32_t r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return "[" + s + "]";
}

}  // namespace

struct SlotExchange::Segments {
  SharedSegment mine;
  std::map<int32_t, SharedSegment> peers;  // process -> its offer
};

SlotExchange::~SlotExchange() {
  if (record_) unwatch(this);
  if (registered_) cudaHostUnregister(registered_);
}

std::string SlotExchange::describe_process(int32_t p) const {
  std::vector<int32_t> ranks;
  for (size_t r = 0; r < processes_.size(); ++r)
    if (processes_[r] == p) ranks.push_back(static_cast<int32_t>(r));
  const World* w = world();
  const std::string pid = w && p >= 0 && p < w->nprocesses() ? "pid " + std::to_string(w->pids[p]) + ", " : "";
  return "process " + std::to_string(p) + " (" + pid + "ranks " + rank_list(ranks) + " of this group)";
}

// Offers of setups that failed after publishing: kept mapped (and named) for the life of the process, so a peer
// that has not read the offer yet finds it and reads why, instead of waiting out the timeout for it.
namespace {
std::mutex failed_mu;
auto* failed_offers = new std::vector<SharedSegment>();  // never destroyed: lives as long as the process
}  // namespace

Status SlotExchange::exchange(int64_t callsite, int32_t group, const std::vector<int32_t>& processes,
                              const SlotOffer& mine, double timeout_s, std::unique_ptr<SlotExchange>& out) {
  std::unique_ptr<SlotExchange> x;
  Status st = run_exchange(callsite, group, processes, mine, timeout_s, x);
  if (st.ok()) {
    out = std::move(x);
    return st;
  }
  if (x && x->segments_ && x->segments_->mine.mapped()) {
    auto* h = static_cast<OfferHeader*>(x->segments_->mine.data());
    std::strncpy(h->message, st.message().c_str(), sizeof(h->message) - 1);
    h->failed.store(1, std::memory_order_release);
    std::lock_guard<std::mutex> lock(failed_mu);
    failed_offers->push_back(std::move(x->segments_->mine));
  }
  return st;
}

Status SlotExchange::run_exchange(int64_t callsite, int32_t group, const std::vector<int32_t>& processes,
                                  const SlotOffer& mine, double timeout_s, std::unique_ptr<SlotExchange>& out) {
  const World* w = world();
  if (!w)
    return Status::Error("this group spans processes, but jaxcoll's multi-process runtime is not set up in this "
                         "process (jaxcoll.distributed.connect() runs when a collective over a mesh of several "
                         "processes is lowered, after jax.distributed.initialize)");
  if (mine.ranks.size() != mine.slots.size() || mine.ranks.size() != mine.buses.size() ||
      mine.ranks.size() > size_t(kMaxRanks))
    return Status::Error("malformed slot offer");
  out.reset(new SlotExchange());
  SlotExchange* x = out.get();
  x->segments_ = std::make_unique<Segments>();
  x->processes_ = processes;
  x->handles_.resize(processes.size());
  std::vector<int32_t> peers;
  for (int32_t p : processes) {
    if (p < 0 || p >= w->nprocesses())
      return Status::Error("the plan names process " + std::to_string(p) + ", but the job has " +
                           std::to_string(w->nprocesses()));
    if (p != w->process && std::find(peers.begin(), peers.end(), p) == peers.end()) peers.push_back(p);
  }
  std::sort(peers.begin(), peers.end());
  for (int32_t p : peers)
    if (!w->same_host(p, w->process))
      return Status::Error(x->describe_process(p) + " runs on another host: CUDA IPC reaches only the GPUs of one "
                           "host (groups across hosts take the network steps, docs/cuda.md)");

  // Publish.
  if (Status st = SharedSegment::create(offer_name(*w, w->process, callsite, group), kSegmentBytes,
                                        x->segments_->mine);
      !st.ok())
    return st;
  auto* h = new (x->segments_->mine.data()) OfferHeader();
  h->fingerprint = mine.fingerprint;
  h->process = w->process;
  h->protocol = mine.protocol;
  h->most_blocks = mine.most_blocks;
  h->nranks = static_cast<int32_t>(mine.ranks.size());
  for (size_t i = 0; i < mine.ranks.size(); ++i) {
    h->entries[i].rank = mine.ranks[i];
    h->entries[i].slot = mine.slots[i];
    std::strncpy(h->entries[i].bus, mine.buses[i].c_str(), sizeof(h->entries[i].bus) - 1);
  }
  h->ready.store(1, std::memory_order_release);

  // Gather: poll every peer's segment until it is published, naming a peer that exits or never comes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::map<int32_t, const OfferHeader*> offers{{w->process, h}};
  for (auto wait = std::chrono::microseconds(100); offers.size() < peers.size() + 1;
       wait = std::min<std::chrono::microseconds>(wait * 2, std::chrono::milliseconds(20))) {
    for (int32_t p : peers) {
      if (offers.count(p)) continue;
      SharedSegment& seg = x->segments_->peers[p];
      if (!seg.mapped()) {
        SharedSegment::Opened opened;
        if (Status st = SharedSegment::open(offer_name(*w, p, callsite, group), seg, opened); !st.ok()) return st;
        if (opened == SharedSegment::Opened::kNotYet) continue;
        if (seg.size() < kSegmentBytes)
          return Status::Error(x->describe_process(p) + " published a GPU offer of " + std::to_string(seg.size()) +
                               " bytes, not " + std::to_string(kSegmentBytes) + ": it runs another jaxcoll build");
      }
      // A peer whose own setup failed still published first: its offer is taken, and the agreement below, or
      // the watchdog once the group runs, reports it.
      const auto* o = static_cast<const OfferHeader*>(seg.data());
      if (o->ready.load(std::memory_order_acquire)) offers[p] = o;
    }
    if (offers.size() == peers.size() + 1) break;
    for (int32_t p : peers)
      if (!offers.count(p) && !process_alive(p))
        return Status::Error(x->describe_process(p) + " has exited before setting up its GPUs for this group");
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      for (int32_t p : peers)
        if (!offers.count(p)) missing += (missing.empty() ? "" : "; ") + x->describe_process(p);
      return Status::Error("timed out after " + std::to_string(timeout_s) + " s waiting for every process to set "
                           "up its GPUs for this group (timeout set by JAXCOLL_TIMEOUT); never arrived: " + missing);
    }
    std::this_thread::sleep_for(wait);
  }

  // Agree: one program, one protocol, each rank once and on its own GPU.
  std::map<std::string, int32_t> bus_of;  // bus id -> rank
  x->blocks_ = mine.most_blocks;
  std::vector<int32_t> seen(processes.size(), 0);
  for (const auto& [p, o] : offers) {
    if (o->magic != kOfferMagic)
      return Status::Error(x->describe_process(p) + " published a GPU offer jaxcoll does not recognise");
    if (o->fingerprint != mine.fingerprint)
      return Status::Error(x->describe_process(p) + " runs a different plan or shape at this call site (fingerprint "
                           + std::to_string(o->fingerprint) + ", this process " + std::to_string(mine.fingerprint) +
                           ")");
    if (o->protocol != mine.protocol)
      return Status::Error(x->describe_process(p) + " chose protocol " +
                           protocol_name(static_cast<Protocol>(o->protocol)) + ", this process " +
                           protocol_name(static_cast<Protocol>(mine.protocol)) +
                           ": set JAXCOLL_CUDA_LL_BYTES alike in every process");
    if (o->failed.load(std::memory_order_acquire))
      return Status::Error(x->describe_process(p) + " failed to set up this group: " +
                           std::string(o->message, strnlen(o->message, sizeof(o->message))));
    x->blocks_ = std::min(x->blocks_, o->most_blocks);
    for (int32_t i = 0; i < o->nranks; ++i) {
      const OfferEntry& e = o->entries[i];
      if (e.rank < 0 || e.rank >= int32_t(processes.size()) || processes[e.rank] != p || seen[e.rank]++)
        return Status::Error(x->describe_process(p) + " offered rank " + std::to_string(e.rank) +
                             ", which the plan's process map does not give it");
      x->handles_[e.rank] = e.slot;
      const std::string bus(e.bus, strnlen(e.bus, sizeof(e.bus)));
      if (auto [it, fresh] = bus_of.emplace(bus, e.rank); !fresh)
        return Status::Error("ranks " + std::to_string(it->second) + " (process " +
                             std::to_string(processes[it->second]) + ") and " + std::to_string(e.rank) +
                             " (process " + std::to_string(p) + ") run on the same GPU " + bus +
                             "; each rank of a group needs its own GPU");
    }
  }
  for (size_t r = 0; r < processes.size(); ++r)
    if (!seen[r])
      return Status::Error(x->describe_process(processes[r]) + " did not offer rank " + std::to_string(r));

  // The group's error record: in the first process's segment, mapped into this process's GPUs.
  const int32_t first = processes[0];
  char* record_page = static_cast<char*>(first == w->process ? x->segments_->mine.data()
                                                             : x->segments_->peers[first].data()) + kRecordOffset;
  JAXCOLL_CUDA_TRY(cudaHostRegister(record_page, kPage, cudaHostRegisterMapped | cudaHostRegisterPortable),
                   "cudaHostRegister of the group's error record (shared memory)");
  x->registered_ = record_page;
  void* device_view = nullptr;
  JAXCOLL_CUDA_TRY(cudaHostGetDevicePointer(&device_view, record_page, 0), "cudaHostGetDevicePointer");
  if (device_view != record_page)  // the kernel and the host read one pointer: unified addressing makes them equal
    return Status::Error("the error record's device address differs from its host address (no unified addressing)");
  x->record_ = reinterpret_cast<ErrorRecord*>(record_page);
  watch(x);
  return {};
}

// ---- the watchdog -------------------------------------------------------------------------------------------

namespace {

struct Watchdog {
  std::mutex mu;
  std::condition_variable changed;
  std::vector<const SlotExchange*> groups;
  bool running = false;
};

Watchdog& watchdog() {
  static auto* d = new Watchdog();  // lives as long as the process: its thread may outlast static destructors
  return *d;
}

// Claim `rec` from the host, as a kernel claims it for a timeout (kernel.cuh, fail): the claim word first, then
// the fields, then the code with release; a record another rank already claimed keeps its first cause.
void claim(ErrorRecord* rec, Failure why, int32_t process, int32_t rank) {
  uint32_t expected = 0;
  if (!__atomic_compare_exchange_n(&rec->claim, &expected, 1u, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return;
  rec->rank = rank;
  rec->lane = rec->step = rec->sem = rec->buffer = -1;
  rec->peer = process;
  rec->have = rec->need = rec->epoch = 0;
  __atomic_store_n(&rec->code, static_cast<uint32_t>(why), __ATOMIC_RELEASE);
}

}  // namespace

void SlotExchange::watch(const SlotExchange* x) {
  Watchdog& d = watchdog();
  std::lock_guard<std::mutex> lock(d.mu);
  d.groups.push_back(x);
  if (!d.running) {
    d.running = true;
    std::thread(run_watchdog).detach();
  }
}

void SlotExchange::unwatch(const SlotExchange* x) {
  Watchdog& d = watchdog();
  std::lock_guard<std::mutex> lock(d.mu);
  d.groups.erase(std::remove(d.groups.begin(), d.groups.end(), x), d.groups.end());
  d.changed.notify_all();
}

void SlotExchange::run_watchdog() {
  Watchdog& d = watchdog();
  std::unique_lock<std::mutex> lock(d.mu);
  while (!d.groups.empty()) {
    for (const SlotExchange* x : d.groups) {
      const World* w = world();
      for (int32_t r = 0; w && r < int32_t(x->processes_.size()); ++r) {
        const int32_t p = x->processes_[r];
        if (p == w->process || (r > 0 && x->processes_[r - 1] == p)) continue;
        if (!process_alive(p)) claim(x->record_, Failure::kProcessGone, p, r);
        else if (!x->peer_failure(p).empty()) claim(x->record_, Failure::kPeerFailed, p, r);
      }
    }
    d.changed.wait_for(lock, std::chrono::milliseconds(50));  // the CPU path's liveness poll interval
  }
  d.running = false;
}

std::string SlotExchange::peer_failure(int32_t process) const {
  auto it = segments_->peers.find(process);
  if (it == segments_->peers.end() || !it->second.mapped()) return {};
  const auto* o = static_cast<const OfferHeader*>(it->second.data());
  if (!o->failed.load(std::memory_order_acquire)) return {};
  return std::string(o->message, strnlen(o->message, sizeof(o->message)));
}

}  // namespace jaxcoll::cuda
