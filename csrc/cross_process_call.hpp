// The parts of a call of a cross-process group (cross_process.hpp) that its transports (transport.hpp) build on:
// the directory of call slots in shared memory, the communicator of a call site, one call in this process.
// Internal to csrc/cross_process.cc (the call) and csrc/transport/ (each peer's side of it).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "csrc/communicator.hpp"
#include "csrc/cross_process.hpp"
#include "csrc/layout.hpp"
#include "csrc/lanes.hpp"
#include "csrc/plan.hpp"
#include "csrc/shared_memory.hpp"
#include "csrc/transport.hpp"
#include "csrc/world.hpp"

namespace jaxcoll {

constexpr uint64_t kDirectoryMagic = 0x324C4C4F43584A44ull;  // "DJXCOLL2"
constexpr int32_t kSlots = 32;                               // calls of one call site in flight in one process
constexpr size_t kPage = 4096;

// Crossed launches. Calls are matched across processes by XLA's launch id, which jax takes per dispatch of an
// executable, before XLA runs the launch; XLA:CPU runs a process's multi-device launches one after another. Two
// threads that dispatch one function race between the two, so one process may run launch 8 before 7 while its
// peer runs 7 before 8: each waits for a launch the other cannot start. When a call is the only one of its call
// site in this process and a peer has published exactly one unmatched call of another launch (same count within
// it) for this long, unchanged, the two are the same call in execution order and are matched (both processes
// see the mirror image and decide alike). Which thread's launch pairs with which across processes was a race in
// jax already; within one thread's dispatches launches run in launch-id order in every process.
constexpr auto kCrossedAfter = std::chrono::seconds(1);

// A slot's state word: generation << 3 | phase. The generation grows each time the owner reuses the slot, so a
// peer that matched a call can tell it from a later one in the same slot.
enum SlotPhase : uint64_t { kFree = 0, kFilling = 1, kPublished = 2, kDone = 3, kFailed = 4 };
constexpr uint64_t phase_of(uint64_t state) { return state & 7; }
constexpr uint64_t generation_of(uint64_t state) { return state >> 3; }

// One call slot of a directory; written by its owner, read (and its doorbell rung, its acks counted) by peers.
struct SlotHeader {
  Doorbell bell{true};  // rung by every signal to the owner's ranks, and by peers publishing or finishing the call
  std::atomic<uint64_t> state{kFree};
  std::atomic<uint32_t> acks{0};  // peer processes done with this generation of the slot
  std::atomic<int32_t> dtype{0};
  std::atomic<int64_t> run_id{0};
  std::atomic<uint64_t> iteration{0};
  std::atomic<uint64_t> data_id{0};  // the data segment: directory prefix + "d" + data_id
  std::atomic<int64_t> block{0};
  char message[512] = {};  // why the owner failed the call (phase kFailed)
};

struct Directory {
  uint64_t magic = kDirectoryMagic;
  uint64_t fingerprint = 0;
  int64_t elements = 0;  // the call site's input elements a rank, and their dtype: fixed per compiled call
  int32_t dtype = 0;
  int32_t nranks = 0;
  int32_t process = 0;
  std::atomic<uint32_t> ready{0};  // set once the header is written
  SlotHeader slots[kSlots];
};

inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Call f(byte offset, bytes) for each maximal run of flagged chunks of a buffer (k chunks per block of `block`
// elements of `dsize` bytes).
template <class F>
void for_each_run(const std::vector<uint8_t>& flags, int64_t k, int64_t block, size_t dsize, F&& f) {
  const int64_t n = static_cast<int64_t>(flags.size());
  for (int64_t i = 0; i < n;) {
    if (!flags[i]) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j < n && flags[j]) ++j;
    const ElementRange range = chunk_range(k, block, i, j - i);
    if (range.size() > 0) f(size_t(range.start) * dsize, size_t(range.size()) * dsize);
    i = j;
  }
}

// Where a process's ranks keep, in one call's data segment, what the call shares: their semaphores always, their
// scratch, input and output where a rank of another process reaches them through a mapped segment. kPrivate: the
// rank uses XLA's buffer (input, output) or the call slot's private scratch. Every process computes the same
// layout for every process from the plan, so no offset is exchanged.
constexpr size_t kPrivate = SIZE_MAX;
struct RankArea {
  size_t semaphores = kPrivate, input = kPrivate, output = kPrivate, scratch = kPrivate;
};

inline std::string process_prefix(const World& w, int32_t p) { return w.segment_prefix(p); }

inline std::string rank_list(const std::vector<int32_t>& ranks) {
  std::string s;
  for (int32_t r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return "[" + s + "]";
}


class CrossProcessCommunicator;

// Every live cross-process communicator of this process, by (callsite, group): the network handler finds calls here.
// The compiled calls that run a call site own its communicator (cross_process_communicator_for); the registry only
// finds it, so a call site whose executables XLA has dropped frees its segments and mappings.
struct Registry {
  std::mutex mu;
  std::map<std::pair<int64_t, int32_t>, std::weak_ptr<CrossProcessCommunicator>> comms;
};

Registry& registry();

class CrossProcessCall;
void finish_call(const std::shared_ptr<CrossProcessCall>& call, Status st);

class CrossProcessCommunicator : public WatchedCalls, public std::enable_shared_from_this<CrossProcessCommunicator> {
 public:
  CrossProcessCommunicator(int64_t callsite, int32_t group, const Plan& plan, std::vector<int32_t> processes,
                           uint64_t fingerprint, int64_t elements, DType dtype, const World& world)
      : callsite_(callsite), group_(group), plan_(plan), processes_(std::move(processes)),
        fingerprint_(fingerprint), elements_(elements), dtype_(dtype), world_(world), me_(world.process) {
    for (int32_t r = 0; r < plan_.nranks; ++r) {
      if (processes_[r] == me_) local_.push_back(r);
      else if (std::find(peers_.begin(), peers_.end(), processes_[r]) == peers_.end()) peers_.push_back(processes_[r]);
    }
    std::sort(peers_.begin(), peers_.end());
    for (size_t i = 0; i < peers_.size(); ++i) {
      const Transport& t = transport_between(world, me_, peers_[i]);
      links_.push_back(t.link(*this, i));
      maps_segments_ += t.maps_segments;
    }
    local_index_.assign(plan_.nranks, -1);
    for (size_t i = 0; i < local_.size(); ++i) local_index_[local_[i]] = static_cast<int32_t>(i);
    // A chunk of a rank's input or output is shared when a step that another process runs names it; then so is
    // every chunk of any ref that names a shared chunk, so each ref is wholly in shared memory or wholly not.
    chunks_.resize(size_t(plan_.nranks) * 2);
    for (int32_t r = 0; r < plan_.nranks; ++r) {
      chunks_[size_t(r) * 2].assign(plan_.ranks[r].input_chunks, 0);
      chunks_[size_t(r) * 2 + 1].assign(plan_.ranks[r].output_chunks, 0);
    }
    auto for_each_ref = [&](auto&& visit) {
      plan_.for_each_step([&](int32_t q, int32_t, int32_t, const Step& s) {
        const ChunkRef* refs = plan_.srcs(s);
        for (int32_t j = 0; j < s.nsrc + s.ndst; ++j)
          if (refs[j].buffer != BufferKind::kScratch) visit(q, refs[j]);
      });
    };
    auto flags = [&](const ChunkRef& ref) -> std::vector<uint8_t>& {
      return chunks_[size_t(ref.rank) * 2 + (ref.buffer == BufferKind::kOutput ? 1 : 0)];
    };
    // (Only peers that map segments reach into the copies; another transport's reads and writes are served by
    // this process, from wherever its own steps use the chunk.)
    for_each_ref([&](int32_t q, const ChunkRef& ref) {
      if (processes_[ref.rank] != processes_[q] &&
          transport_between(world, processes_[ref.rank], processes_[q]).maps_segments)
        std::fill_n(flags(ref).begin() + ref.index, ref.count, uint8_t{1});
    });
    for (bool changed = true; changed;) {
      changed = false;
      for_each_ref([&](int32_t, const ChunkRef& ref) {
        auto& f = flags(ref);
        const auto first = f.begin() + ref.index, last = first + ref.count;
        if (std::find(first, last, uint8_t{1}) != last && std::find(first, last, uint8_t{0}) != last) {
          std::fill(first, last, uint8_t{1});
          changed = true;
        }
      });
    }
    // A rank's scratch is shared when a step of another process that maps segments names it. Otherwise it stays in
    // this process's memory: a plan's scratch can be several times its output (7 times for the synthesized direct
    // all_reduce over 2 processes), and every compiled call site holds its segments for its life.
    scratch_shared_.assign(plan_.nranks, 0);
    plan_.for_each_step([&](int32_t q, int32_t, int32_t, const Step& s) {
      const ChunkRef* refs = plan_.srcs(s);
      for (int32_t j = 0; j < s.nsrc + s.ndst; ++j)
        if (refs[j].buffer == BufferKind::kScratch && processes_[refs[j].rank] != processes_[q] &&
            transport_between(world, processes_[refs[j].rank], processes_[q]).maps_segments)
          scratch_shared_[refs[j].rank] = 1;
    });
    if (plan_.in_place)  // input and output are one buffer (or one inside the other): shared whole, together
      for (int32_t r = 0; r < plan_.nranks; ++r) {
        const bool either = shared(r, BufferKind::kInput) || shared(r, BufferKind::kOutput);
        for (int b = 0; b < 2; ++b) std::fill(chunks_[size_t(r) * 2 + b].begin(), chunks_[size_t(r) * 2 + b].end(),
                                              uint8_t{either});
      }
    data_.resize(kSlots);
    data_ids_.assign(kSlots, 0);
    private_scratch_.resize(kSlots);
    for (auto& slot : private_scratch_) slot.resize(local_.size());
    watch(this);
  }
  // The last owner is gone (XLA dropped every executable of the call site, and no call of it is in flight): the
  // call site leaves the registry and the watchdog, and its segments are unmapped, this process's unlinked.
  ~CrossProcessCommunicator() override;

  // The watchdog: a call whose local ranks have not all arrived by its deadline fails (the peers' workers time
  // out on their own, waiting for this process to publish it).
  bool expire(Clock::time_point now, std::vector<Completion>& pending, Status& error) override;

  Status open_directory() {
    std::lock_guard<std::mutex> lock(mu_);
    if (directory_.mapped()) return {};
    Status st = SharedSegment::create(directory_name(me_), sizeof(Directory), directory_);
    if (!st.ok()) return st;
    Directory* d = new (directory_.data()) Directory();
    d->fingerprint = fingerprint_;
    d->elements = elements_;
    d->dtype = static_cast<int32_t>(dtype_);
    d->nranks = plan_.nranks;
    d->process = me_;
    d->ready.store(1, std::memory_order_release);
    return {};
  }

  std::string describe() const {
    return "jaxcoll " + std::string(collective_name(plan_.collective)) + " (callsite " + std::to_string(callsite_) +
           ", group " + std::to_string(group_) + ", process " + std::to_string(me_) + ")";
  }

  std::vector<int32_t> ranks_of(int32_t process) const {
    std::vector<int32_t> out;
    for (int32_t r = 0; r < plan_.nranks; ++r)
      if (processes_[r] == process) out.push_back(r);
    return out;
  }

  // The error naming process p, which calls this call site with `elements` of `dtype` a rank; "" when they are
  // this process's. Processes that compiled another shape or dtype run other executables, whose launches never
  // meet: the call site's shape is compared at once, not when a call is matched.
  std::string shape_differs(int32_t p, int64_t elements, int32_t dtype) const {
    if (elements == elements_ && dtype == static_cast<int32_t>(dtype_)) return {};
    return describe() + ": " + describe_process(p) + " passes " + std::to_string(elements) + " elements of " +
           dtype_name(static_cast<DType>(dtype)) + " a rank at this call site, this process " +
           std::to_string(elements_) + " of " + dtype_name(dtype_) +
           "; every process must call it with the same shape and dtype";
  }

  std::string describe_process(int32_t p) const {
    return "process " + std::to_string(p) + " (pid " + std::to_string(world_.pids[p]) + ", ranks " +
           rank_list(ranks_of(p)) + " of this group)";
  }

  // Process p, which the call waited on until its deadline, with what can be told of it: alive (its presence's
  // lock, or its connection) but stalled, or gone.
  std::string describe_stalled(int32_t p) const {
    return describe_process(p) + " on " + world_.describe_host(p) +
           (peer_alive(p) ? " is alive but stalled: it made no progress in this call within JAXCOLL_TIMEOUT "
                               "(a stopped, hung or starved process)"
                             : " has exited");
  }

  // Whether peer process p still runs (as its transport tells).
  bool peer_alive(int32_t p) const {
    return links_[std::lower_bound(peers_.begin(), peers_.end(), p) - peers_.begin()]->alive();
  }

  // Per chunk of rank's input (or output): 1 where shared.
  const std::vector<uint8_t>& chunk_flags(int32_t rank, BufferKind b) const {
    return chunks_[size_t(rank) * 2 + (b == BufferKind::kOutput ? 1 : 0)];
  }
  bool shares_scratch(int32_t rank) const { return scratch_shared_[size_t(rank)] != 0; }
  bool shared(int32_t rank, BufferKind b) const {
    const auto& f = chunk_flags(rank, b);
    return std::find(f.begin(), f.end(), uint8_t{1}) != f.end();
  }

  // The layout of `process`'s ranks in a call's data segment, for blocks of `block` elements of `dtype`.
  std::vector<RankArea> layout(int32_t process, int64_t block, DType dtype, size_t& bytes) const {
    std::vector<RankArea> areas(plan_.nranks);
    const size_t dsize = dtype_size(dtype);
    const size_t in_bytes = size_t(plan_.in_blocks) * size_t(block) * dsize;
    const size_t out_bytes = size_t(plan_.out_blocks) * size_t(block) * dsize;
    size_t at = 0;
    for (int32_t r = 0; r < plan_.nranks; ++r) {
      if (processes_[r] != process) continue;
      const RankProgram& prog = plan_.ranks[r];
      RankArea& a = areas[r];
      a.semaphores = at;
      at = align_up(at + size_t(prog.semaphores) * sizeof(uint32_t), kPage);
      const size_t scratch = scratch_bytes(plan_, r, block, dtype);
      if (scratch && scratch_shared_[r]) {
        a.scratch = at;
        at = align_up(at + scratch, kPage);
      }
      if (plan_.in_place) {
        if (shared(r, BufferKind::kInput)) {
          a.input = a.output = at;
          at = align_up(at + std::max(in_bytes, out_bytes), kPage);
        }
      } else {
        if (shared(r, BufferKind::kInput)) {
          a.input = at;
          at = align_up(at + in_bytes, kPage);
        }
        if (shared(r, BufferKind::kOutput)) {
          a.output = at;
          at = align_up(at + out_bytes, kPage);
        }
      }
    }
    bytes = std::max<size_t>(at, kPage);
    return areas;
  }

  std::string directory_name(int32_t p) const {
    return process_prefix(world_, p) + "c" + std::to_string(callsite_) + "g" + std::to_string(group_);
  }
  std::string data_name(int32_t p, uint64_t id) const { return process_prefix(world_, p) + "d" + std::to_string(id); }

  Directory& directory() { return *static_cast<Directory*>(directory_.data()); }

  // -- failure state (a failed call site stays failed, as in one process) --
  void fail(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(failure_mu_);
      if (failure_.empty()) failure_ = message;
    }
    failed_.store(true, std::memory_order_release);
  }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string failure() const {
    std::lock_guard<std::mutex> lock(failure_mu_);
    return failure_;
  }

  const int64_t callsite_;
  const int32_t group_;
  const Plan plan_;
  const std::vector<int32_t> processes_;
  const uint64_t fingerprint_;
  const int64_t elements_;  // input elements a rank at this call site
  const DType dtype_;
  const World& world_;
  const int32_t me_;
  std::vector<int32_t> local_;        // ranks hosted here, ascending
  std::vector<int32_t> local_index_;  // rank -> position in local_, or -1
  std::vector<int32_t> peers_;        // other processes hosting ranks of the group, ascending
  std::vector<std::unique_ptr<PeerLink>> links_;  // per peer: its transport (transport.hpp)
  uint32_t maps_segments_ = 0;                     // peers that map this process's segments (and ack its slots)
  std::vector<std::vector<uint8_t>> chunks_;  // [rank * 2 + (input 0, output 1)]: per chunk, 1 if shared
  std::vector<uint8_t> scratch_shared_;       // per rank: 1 if its scratch lies in the data segment

  std::mutex mu_;  // guards what follows
  SharedSegment directory_;
  std::vector<SharedSegment> data_;       // per slot
  std::vector<uint64_t> data_ids_;        // per slot
  std::vector<std::vector<GrowableBuffer>> private_scratch_;  // per slot, per local rank: scratch no peer maps
  std::vector<std::map<int64_t, uint64_t>> iterations_;  // per local rank: run id -> calls in that launch
  std::vector<std::shared_ptr<CrossProcessCall>> active_;

  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mu_;
  std::string failure_;
};

// One call of a cross-process group in this process: what its local ranks published and what the worker needs.
class CrossProcessCall : public CallFailure {
 public:
  CrossProcessCall(CrossProcessCommunicator& comm, int64_t run_id, uint64_t iteration, int32_t slot, int64_t block,
                   DType dtype, const CallSite& site, Clock::time_point deadline)
      : comm_(comm), owner_(comm.shared_from_this()), run_id_(run_id), iteration_(iteration), slot_(slot),
        block_(block), dtype_(dtype), site_(site),
        deadline_(deadline), buffers_(comm.local_.size()), copy_out_(comm.local_.size()),
        completions_(comm.local_.size()), handoff_(std::make_unique<std::atomic<int>[]>(comm.local_.size())),
        arrived_ranks_(comm.local_.size(), false), arrived_ns_(comm.local_.size(), 0),
        found_(comm.peers_.size(), false),
        peer_run_id_(comm.peers_.size(), run_id), crossed_run_(comm.peers_.size(), run_id),
        crossed_since_(comm.peers_.size()) {
    for (size_t i = 0; i < comm.peers_.size(); ++i) peer_calls_.push_back(comm.links_[i]->join(*this, i));
  }

  // -- CallFailure --
  void fail(const std::string& message) override {
    comm_.fail(message);
    SlotHeader& me = header();
    const uint64_t st = me.state.load(std::memory_order_acquire);
    if (phase_of(st) != kFailed) {
      std::snprintf(me.message, sizeof(me.message), "%s", message.c_str());
      me.state.store((generation_of(st) << 3) | kFailed, std::memory_order_release);
    }
    ring_peers();
    me.bell.ring();
    if (!told_failure_.exchange(true))
      for (auto& peer : peer_calls_) peer->tell(PeerCall::Event::kFailed, message);
  }
  bool failed() const override { return comm_.failed(); }
  std::string failure() const override { return comm_.failure(); }
  std::string stalled(const std::vector<int32_t>& ranks) override {
    std::string out;
    for (int32_t p : comm_.peers_)
      if (std::any_of(ranks.begin(), ranks.end(), [&](int32_t r) { return comm_.processes_[r] == p; }))
        out += "; " + comm_.describe_stalled(p);
    return out;
  }
  void poll() override {
    const auto now = Clock::now();
    if (now - last_poll_ < std::chrono::milliseconds(20)) return;
    last_poll_ = now;
    for (size_t i = 0; i < comm_.peers_.size(); ++i) {
      const int32_t p = comm_.peers_[i];
      // Whether the peer is alive is asked first, what it said of the call after: a peer says that it failed
      // or finished the call before it can exit, so a peer seen gone here has said all it will say.
      const bool alive = comm_.links_[i]->alive();
      if (const std::string why = peer_failure(i); !why.empty()) {
        fail(why);
        return;
      }
      // A peer done with this call may exit at once (a job's last call): gone, but nothing of this call is
      // owed by it.
      if (!alive && !peer_done(i)) {
        fail(site_.describe() + ": " + comm_.describe_process(p) + " has exited (noticed during launch " +
             std::to_string(run_id_) + ", call " + std::to_string(iteration_) +
             " of this site in it); its ranks will never arrive or finish their steps");
        return;
      }
    }
  }
  // The error naming peer process i and why it failed this call, or "" while it has not said so (in its slot,
  // or in a message from its connection).
  std::string peer_failure(size_t i) {
    const std::string why = peer_calls_[i]->failure();
    if (why.empty()) return why;
    return site_.describe() + ": " + comm_.describe_process(comm_.peers_[i]) + " failed this call: " + why;
  }
  // The first peer's failure of this call (peer_failure), or "". With `gone_only`, only of a peer that has
  // left: a peer still here may be echoing this process's own failure.
  std::string any_peer_failure(bool gone_only = false) {
    for (size_t i = 0; i < comm_.peers_.size(); ++i) {
      if (gone_only && comm_.links_[i]->alive()) continue;
      if (std::string why = peer_failure(i); !why.empty()) return why;
    }
    return {};
  }
  // What this process told its peers of the call so far out of its hands (PeerLink::flush), or `deadline`: what
  // it said of a call must outlive it, since it may exit as soon as the call returns.
  bool flush_peers(Clock::time_point deadline) {
    bool all = true;
    for (auto& link : comm_.links_) all &= link->flush(deadline);
    return all;
  }

  SlotHeader& header() { return comm_.directory().slots[slot_]; }
  void tell_peers(PeerCall::Event event) {
    for (auto& peer : peer_calls_) peer->tell(event, {});
  }
  // Whether peer i's one unmatched call of launch `other` has stood unchanged for kCrossedAfter while this call is
  // the only one of the call site here (kCrossedAfter above); under comm_.mu_.
  bool crossed(size_t i, int64_t other) {
    const auto now = Clock::now();
    if (comm_.active_.size() != 1 || crossed_run_[i] != other || crossed_since_[i] == Clock::time_point{}) {
      crossed_run_[i] = other;
      crossed_since_[i] = comm_.active_.size() == 1 ? now : Clock::time_point{};
      return false;
    }
    return now - crossed_since_[i] >= kCrossedAfter;
  }
  // The call as every process of the job names it in its trace: the launch of the group's lowest process (the
  // launches of a call differ across processes only where they crossed) and the call's count within it.
  JobCall job_call() const {
    const bool lowest = comm_.peers_.empty() || comm_.me_ < comm_.peers_[0];
    return {lowest ? run_id_ : peer_run_id_[0], static_cast<int32_t>(iteration_)};
  }
  // Whether peer process i has finished this call's steps (its ranks touch no buffer of the call any more).
  bool peer_done(size_t i) { return peer_calls_[i]->done(); }
  void ring_peers() {
    for (auto& peer : peer_calls_) peer->wake();
  }

  CrossProcessCommunicator& comm_;
  const std::shared_ptr<CrossProcessCommunicator> owner_;  // a call in flight keeps its call site's segments
  const int64_t run_id_;
  const uint64_t iteration_;
  const int32_t slot_;
  const int64_t block_;
  const DType dtype_;
  const CallSite site_;
  const Clock::time_point deadline_;
  std::vector<CallBuffers> buffers_;  // per local rank
  std::vector<std::vector<CopyOut>> copy_out_;  // per local rank: what goes back to XLA's output after the call
  std::vector<PeerView> local_views_;
  std::vector<Completion> completions_;
  // Per local rank: whether its thread is still waiting for the call, returned it finished (inline), or
  // returned it pending (deferred: its completion is owed).
  enum Handoff { kWaiting = 0, kInline = 1, kDeferred = 2 };
  std::unique_ptr<std::atomic<int>[]> handoff_;
  std::vector<GrowableBuffer> staging_;  // per local rank, in-place reduce_scatter without sharing
  int32_t arrived_ = 0;                  // guarded by comm_.mu_
  std::vector<bool> arrived_ranks_;      // per local rank, guarded by comm_.mu_
  std::vector<int64_t> arrived_ns_;      // per local rank: when it arrived, while tracing (0: not traced)
  bool arrived(size_t i) {
    std::lock_guard<std::mutex> lock(comm_.mu_);
    return arrived_ranks_[i];
  }
  Status status_;
  Doorbell finished_;
  std::vector<bool> found_;  // per peer: its side of the call found (PeerCall::find), under comm_.mu_
  std::vector<int64_t> peer_run_id_;  // per peer: its launch id for this call (this one's, unless launches crossed)
  std::vector<int64_t> crossed_run_;  // per peer: the other launch it published alone, since crossed_since_
  std::vector<Clock::time_point> crossed_since_;
  std::vector<std::unique_ptr<PeerCall>> peer_calls_;  // per peer: the call through its transport
  std::atomic<bool> told_failure_{false};
  Clock::time_point last_poll_{};
};

}  // namespace jaxcoll
