// The shared-memory transport: peer processes of this host (they share /dev/shm). Each process owns a directory of
// call slots per call site and a data segment per slot (cross_process_call.hpp); a peer finds this process's slot
// for a call by name, maps its data segment and reads and writes the chunks of this process's ranks there itself,
// signals their semaphores there and rings the slot's doorbell. What a peer did with a call is its slot's phase;
// whether it lives, its presence's lock (shared_memory.hpp).
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "csrc/collectives.hpp"
#include "csrc/cross_process_call.hpp"
#include "csrc/shared_memory.hpp"
#include "csrc/transport.hpp"
#include "csrc/world.hpp"

namespace jaxcoll {

namespace {

class ShmCall;

// A peer process of this host at one call site: its directory and the data segments of its slots, as mapped here.
class ShmLink : public PeerLink {
 public:
  ShmLink(CrossProcessCommunicator& comm, size_t peer)
      : comm_(comm), peer_(peer), data_(kSlots), data_ids_(kSlots), taken_(kSlots, 0) {
    // The processes of the group that map the peer's segments (each acknowledges each of its slots it used).
    const int32_t p = comm.peers_[peer];
    std::vector<int32_t> seen;
    for (int32_t q : comm.processes_)
      if (q != p && std::find(seen.begin(), seen.end(), q) == seen.end()) {
        seen.push_back(q);
        mappers_ += transport_between(comm.world_, p, q).maps_segments;
      }
  }
  std::unique_ptr<PeerCall> join(CrossProcessCall& call, size_t peer) override;
  bool alive() const override { return process_alive(comm_.peers_[peer_]); }
  bool flush(Clock::time_point) override { return true; }  // what a peer reads from a slot is there already

 private:
  friend class ShmCall;
  CrossProcessCommunicator& comm_;
  const size_t peer_;
  SharedSegment dir_;
  std::vector<SharedSegment> data_;  // per slot
  std::vector<uint64_t> data_ids_;   // per slot
  // Per slot: the generation of it that a call here was matched with, plus one (0: none). A peer's call is the
  // match of one call here: a slot so taken is no match for any other, whatever its launch id and phase.
  std::vector<uint64_t> taken_;
  uint32_t mappers_ = 0;  // processes of the group that map the peer's segments, as its maps_segments_
};

// One call through a peer of this host: the peer's slot holding the call, once found.
class ShmCall : public PeerCall {
 public:
  ShmCall(ShmLink& link, CrossProcessCall& call, size_t peer) : link_(link), call_(call), i_(peer) {}

  // Find the peer's slot for the call. Opens the peer's directory on first use and checks its fingerprint.
  Status find(bool& found) override {
    CrossProcessCommunicator& c = call_.comm_;
    CrossProcessCall& call = call_;
    const int32_t p = c.peers_[i_];
    const size_t i = i_;
    found = false;
    SharedSegment& dir = link_.dir_;
    if (!dir.mapped()) {
      SharedSegment::Opened opened;
      Status st = SharedSegment::open(c.directory_name(p), dir, opened);
      if (!st.ok()) return st;
      if (opened == SharedSegment::Opened::kNotYet) return {};
      if (dir.size() < sizeof(Directory)) {
        dir = SharedSegment();
        return {};
      }
    }
    Directory* d = static_cast<Directory*>(dir.data());
    if (d->ready.load(std::memory_order_acquire) != 1) return {};
    if (d->magic == kDirectoryMagic)
      if (std::string why = c.shape_differs(p, d->elements, d->dtype); !why.empty()) return Status::Error(why);
    if (d->magic != kDirectoryMagic || d->nranks != c.plan_.nranks || d->fingerprint != c.fingerprint_)
      return Status::Error(call.site_.describe() + ": " + c.describe_process(p) +
                           " runs a different plan at this call site (plan fingerprint " +
                           std::to_string(d->fingerprint) + ", this process " + std::to_string(c.fingerprint_) +
                           "); every process must run the same program with the same jaxcoll version");
    // A slot as read at one moment: its state word and what the owner published in it.
    struct Seen {
      int32_t slot = -1;
      uint64_t state = 0;
      int64_t run_id = 0, block = 0;
      int32_t dtype = 0;
      uint64_t data_id = 0;
    };
    auto take = [&](const Seen& seen) -> Status {
      const int32_t s = seen.slot;
      const uint64_t st1 = seen.state;
      const int64_t block = seen.block;
      const int32_t dtype = seen.dtype;
      const uint64_t data_id = seen.data_id;
      if (block != call.block_ || dtype != static_cast<int32_t>(call.dtype_))
        return Status::Error(call.site_.describe() + ": " + c.describe_process(p) + " called with " +
                             std::to_string(block) + "-element blocks of " +
                             dtype_name(static_cast<DType>(dtype)) + ", this process with " +
                             std::to_string(call.block_) + " of " + dtype_name(call.dtype_) +
                             "; every rank must pass the same shape");
      // Map the data segment of this slot (a new one when the owner grew it).
      SharedSegment& data = link_.data_[s];
      if (link_.data_ids_[s] != data_id || !data.mapped()) {
        SharedSegment::Opened opened;
        Status st = SharedSegment::open(c.data_name(p, data_id), data, opened);
        if (!st.ok()) return st;
        if (opened == SharedSegment::Opened::kNotYet)
          return Status::Error(call.site_.describe() + ": the data segment of " + c.describe_process(p) +
                               " is gone (" + c.data_name(p, data_id) + ")");
        link_.data_ids_[s] = data_id;
      }
      size_t bytes = 0;
      c.layout(p, call.block_, call.dtype_, bytes);
      if (data.size() < bytes)
        return Status::Error(call.site_.describe() + ": the data segment of " + c.describe_process(p) + " holds " +
                             std::to_string(data.size()) + " bytes, the call needs " +
                             std::to_string(bytes));
      slot_ = s;
      generation_ = generation_of(st1);
      call.peer_run_id_[i] = seen.run_id;
      link_.taken_[s] = generation_ + 1;
      found = true;
      return Status{};
    };
    // The peer's one unmatched call of another launch at this call's count, if exactly one. Done counts as
    // unmatched here: the peer may have matched its call with this one first and, where its steps need nothing
    // of this process's ranks (two-shot reads the inputs staged at publication and writes the outputs' copies),
    // run them all already; it waits in phase done for this process to decide alike. A slot taken by a call
    // here is skipped, so a done slot of the peer at this count not taken here ran with a call here that has not
    // found its peer yet: this one, where it is the only call of the site here (as crossing requires).
    Seen other;
    int32_t others = 0;
    for (int32_t s = 0; s < kSlots; ++s) {
      SlotHeader& h = d->slots[s];
      Seen seen{s, h.state.load(std::memory_order_acquire)};
      const uint64_t ph = phase_of(seen.state);
      if (ph != kPublished && ph != kDone && ph != kFailed) continue;
      seen.run_id = h.run_id.load(std::memory_order_relaxed);
      const uint64_t iteration = h.iteration.load(std::memory_order_relaxed);
      seen.block = h.block.load(std::memory_order_relaxed);
      seen.dtype = h.dtype.load(std::memory_order_relaxed);
      seen.data_id = h.data_id.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (generation_of(h.state.load(std::memory_order_relaxed)) != generation_of(seen.state)) continue;  // reused
      if (iteration != call.iteration_) continue;
      if (link_.taken_[s] == generation_of(seen.state) + 1) continue;
      if (seen.run_id == call.run_id_) return take(seen);
      // (A done slot that every process acknowledged is an old call, finished everywhere.)
      if (ph == kPublished || (ph == kDone && h.acks.load(std::memory_order_acquire) < link_.mappers_)) {
        other = seen;
        ++others;
      }
    }
    if (others == 1 && call.crossed(i, other.run_id)) return take(other);
    if (others != 1) call.crossed(i, call.run_id_);  // nothing crossed: start over
    return {};
  }

  void address(std::vector<PeerView>& views) override {
    CrossProcessCommunicator& c = call_.comm_;
    const int32_t p = c.peers_[i_];
    size_t bytes = 0;
    const std::vector<RankArea> areas = c.layout(p, call_.block_, call_.dtype_, bytes);
    char* base = static_cast<char*>(link_.data_[slot_].data());
    SlotHeader& h = header();
    for (int32_t r : c.ranks_of(p)) {
      const RankArea& a = areas[r];
      auto at = [&](size_t off) -> void* { return off == kPrivate ? nullptr : base + off; };
      PeerView& v = views[r];
      v = {at(a.input), at(a.output), at(a.scratch), reinterpret_cast<std::atomic<uint32_t>*>(base + a.semaphores),
           &h.bell};
      // An in-place plan's input is a block of its output (all_gather) or the reverse (reduce_scatter), as the
      // owner staged it.
      const int64_t block_bytes = call_.block_ * int64_t(dtype_size(call_.dtype_));
      const InPlace aliasing = collective_info(c.plan_.collective).in_place;
      if (c.plan_.in_place && v.input && aliasing == InPlace::kInputInOutput)
        v.input = static_cast<char*>(v.output) + r * block_bytes;
      if (c.plan_.in_place && v.input && aliasing == InPlace::kOutputInInput)
        v.output = static_cast<char*>(v.input) + r * block_bytes;
    }
  }

  void wake() override {
    if (slot_ >= 0) header().bell.ring();
  }
  // The peer reads what this process did with the call from this process's own slot (its phase and message).
  void tell(Event, const std::string&) override {}

  std::string failure() override {
    if (slot_ < 0) return {};
    SlotHeader& h = header();
    const uint64_t st = h.state.load(std::memory_order_acquire);
    if (generation_of(st) != generation_ || phase_of(st) != kFailed) return {};
    return std::string(h.message, strnlen(h.message, sizeof(h.message)));
  }
  bool done() override {
    if (slot_ < 0) return false;
    const uint64_t s = header().state.load(std::memory_order_acquire);
    return generation_of(s) == generation_ && phase_of(s) == kDone;
  }
  // The peer reuses its slot once every process that used it has acknowledged it.
  void finish(bool ok) override {
    if (ok && slot_ >= 0) header().acks.fetch_add(1);
  }

 private:
  SlotHeader& header() { return static_cast<Directory*>(link_.dir_.data())->slots[slot_]; }

  ShmLink& link_;
  CrossProcessCall& call_;
  const size_t i_;
  int32_t slot_ = -1;  // the peer's slot holding the call, once found
  uint64_t generation_ = 0;
};

std::unique_ptr<PeerCall> ShmLink::join(CrossProcessCall& call, size_t peer) {
  return std::make_unique<ShmCall>(*this, call, peer);
}

bool same_host(const World& world, int32_t a, int32_t b) { return world.same_host(a, b); }

std::unique_ptr<PeerLink> shm_link(CrossProcessCommunicator& comm, size_t peer) {
  return std::make_unique<ShmLink>(comm, peer);
}

}  // namespace

extern const Transport shared_memory_transport{"shared memory", same_host, /*maps_segments=*/true, shm_link};

}  // namespace jaxcoll
