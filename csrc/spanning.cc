#include "csrc/spanning.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "csrc/env.hpp"
#include "csrc/layout.hpp"
#include "csrc/memory.hpp"
#include "csrc/net.hpp"
#include "csrc/shared_memory.hpp"
#include "csrc/workers.hpp"
#include "csrc/world.hpp"

namespace jaxcoll {

namespace {

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
constexpr auto kCrossedAfter = std::chrono::milliseconds(250);
constexpr size_t kCrossedKept = 64;  // calls of each peer matched across launches, remembered (see consumed_)

// A slot's state word: generation << 3 | phase. The generation grows each time the owner reuses the slot, so a
// peer that matched a call can tell it from a later one in the same slot.
enum Phase : uint64_t { kFree = 0, kFilling = 1, kPublished = 2, kDone = 3, kFailed = 4 };
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

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

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

// Where a process's ranks keep, in one call's data segment, what the call shares: their semaphores and scratch
// always, their input and output where a rank of another process reaches them. kPrivate: the rank uses XLA's
// buffer. Every process computes the same layout for every process from the plan, so no offset is exchanged.
constexpr size_t kPrivate = SIZE_MAX;
struct RankArea {
  size_t semaphores = kPrivate, input = kPrivate, output = kPrivate, scratch = kPrivate;
};

std::string process_prefix(const World& w, int32_t p) {
  return "/jaxcoll-" + w.token + "-" + std::to_string(w.pids[p]) + "-";
}

std::string rank_list(const std::vector<int32_t>& ranks) {
  std::string s;
  for (int32_t r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return "[" + s + "]";
}

// Helper threads a call of this process may use: the host's cores split among the job's processes on this host,
// less the worker's own; JAXCOLL_SPAN_HELPERS overrides (read once).
int helpers_per_call(const World& w) {
  static const int n = [&w] {
    int local = 0;
    for (int32_t p = 0; p < w.nprocesses(); ++p) local += w.same_host(p, w.process);
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return env_settings().span_helpers.value_or(std::max(0, cores / std::max(1, local) - 1));
  }();
  return n;
}

// A call key as processes name it: (process, run id, call of the site within the launch).
using CallKey = std::tuple<int32_t, int64_t, uint64_t>;

// What peers on other hosts told this process about the calls of one call site: their publications (block,
// dtype, plan fingerprint), which of those they finished, and their failures. Messages may come before this
// process has reached the call site at all, so the mailbox lives apart from the communicator.
struct Mailbox {
  std::mutex mu;
  std::map<int32_t, NetMessage> sites;  // per process: its first publication (plan fingerprint, dtype, elements)
  std::map<CallKey, NetMessage> published;
  std::set<CallKey> done;
  std::map<CallKey, std::string> failed;
};

struct Mailboxes {
  std::mutex mu;
  std::map<std::pair<int64_t, int32_t>, std::shared_ptr<Mailbox>> boxes;
};

Mailboxes& mailboxes() {
  static Mailboxes* m = new Mailboxes();  // leaked on purpose: the network threads outlive statics
  return *m;
}

std::shared_ptr<Mailbox> mailbox(int64_t callsite, int32_t group) {
  Mailboxes& m = mailboxes();
  std::lock_guard<std::mutex> lock(m.mu);
  auto& box = m.boxes[{callsite, group}];
  if (!box) box = std::make_shared<Mailbox>();
  return box;
}

}  // namespace

class SpanningCommunicator;

namespace {

// Every live spanning communicator of this process, by (callsite, group): the network handler finds calls here.
// The compiled calls that run a call site own its communicator (spanning_communicator_for); the registry only
// finds it, so a call site whose executables XLA has dropped frees its segments and mappings.
struct Registry {
  std::mutex mu;
  std::map<std::pair<int64_t, int32_t>, std::weak_ptr<SpanningCommunicator>> comms;
};

Registry& registry() {
  static Registry* r = new Registry();  // leaked on purpose: the watchdog and network threads outlive statics
  return *r;
}

}  // namespace

class SpanCall;
void finish_call(const std::shared_ptr<SpanCall>& call, Status st);

class SpanningCommunicator : public Gathering, public std::enable_shared_from_this<SpanningCommunicator> {
 public:
  SpanningCommunicator(int64_t callsite, int32_t group, const Plan& plan, std::vector<int32_t> processes,
                       uint64_t fingerprint, int64_t elements, DType dtype, const World& world)
      : callsite_(callsite), group_(group), plan_(plan), processes_(std::move(processes)),
        fingerprint_(fingerprint), elements_(elements), dtype_(dtype), world_(world), me_(world.process) {
    for (int32_t r = 0; r < plan_.nranks; ++r) {
      if (processes_[r] == me_) local_.push_back(r);
      else if (std::find(peers_.begin(), peers_.end(), processes_[r]) == peers_.end()) peers_.push_back(processes_[r]);
    }
    std::sort(peers_.begin(), peers_.end());
    for (int32_t p : peers_) net_.push_back(!world.same_host(p, me_));
    mailbox_ = mailbox(callsite_, group_);
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
      for (int32_t q = 0; q < plan_.nranks; ++q) {
        const RankProgram& prog = plan_.ranks[q];
        for (int32_t l = 0; l < prog.nlanes; ++l) {
          const Lane& lane = plan_.lanes[prog.first_lane + l];
          for (int32_t i = 0; i < lane.nsteps; ++i) {
            const Step& s = plan_.steps[lane.first_step + i];
            const ChunkRef* refs = plan_.srcs(s);
            for (int32_t j = 0; j < s.nsrc + s.ndst; ++j)
              if (refs[j].buffer != BufferKind::kScratch) visit(q, refs[j]);
          }
        }
      }
    };
    auto flags = [&](const ChunkRef& ref) -> std::vector<uint8_t>& {
      return chunks_[size_t(ref.rank) * 2 + (ref.buffer == BufferKind::kOutput ? 1 : 0)];
    };
    // (Only shared-memory peers reach into the copies; a network peer's reads and writes are served by this
    // process, from wherever its own steps use the chunk.)
    for_each_ref([&](int32_t q, const ChunkRef& ref) {
      if (processes_[ref.rank] != processes_[q] && world.same_host(processes_[ref.rank], processes_[q]))
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
    if (plan_.in_place)  // input and output are one buffer (or one inside the other): shared whole, together
      for (int32_t r = 0; r < plan_.nranks; ++r) {
        const bool either = shared(r, BufferKind::kInput) || shared(r, BufferKind::kOutput);
        for (int b = 0; b < 2; ++b) std::fill(chunks_[size_t(r) * 2 + b].begin(), chunks_[size_t(r) * 2 + b].end(),
                                              uint8_t{either});
      }
    peer_dirs_.resize(peers_.size());
    consumed_.resize(peers_.size());
    peer_data_.resize(peers_.size() * kSlots);
    peer_data_ids_.assign(peers_.size() * kSlots, 0);
    data_.resize(kSlots);
    data_ids_.assign(kSlots, 0);
    watch(this);
  }
  // The last owner is gone (XLA dropped every executable of the call site, and no call of it is in flight): the
  // call site leaves the registry and the watchdog, and its segments are unmapped, this process's unlinked.
  ~SpanningCommunicator() override;

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

  // Process p, which the call waited on until its deadline, with what can be told of it: alive (its pidfd, or
  // its connection) but stalled, or gone.
  std::string describe_stalled(int32_t p) const {
    return describe_process(p) + " on " + world_.describe_host(p) +
           (process_alive(p) ? " is alive but stalled: it made no progress in this call within JAXCOLL_TIMEOUT "
                               "(a stopped, hung or starved process)"
                             : " has exited");
  }

  // Per chunk of rank's input (or output): 1 where shared.
  const std::vector<uint8_t>& chunk_flags(int32_t rank, BufferKind b) const {
    return chunks_[size_t(rank) * 2 + (b == BufferKind::kOutput ? 1 : 0)];
  }
  bool shared(int32_t rank, BufferKind b) const {
    const auto& f = chunk_flags(rank, b);
    return std::find(f.begin(), f.end(), uint8_t{1}) != f.end();
  }

  // The layout of `process`'s ranks in a call's data segment, for blocks of `block` elements of `dtype`.
  std::vector<RankArea> layout(int32_t process, int64_t block, DType dtype, size_t& bytes) const {
    std::vector<RankArea> areas(plan_.nranks);
    const size_t dsize = dtype_size(dtype), asize = accum_size(dtype);
    const size_t in_bytes = size_t(plan_.in_blocks) * size_t(block) * dsize;
    const size_t out_bytes = size_t(plan_.out_blocks) * size_t(block) * dsize;
    size_t at = 0;
    for (int32_t r = 0; r < plan_.nranks; ++r) {
      if (processes_[r] != process) continue;
      const RankProgram& prog = plan_.ranks[r];
      RankArea& a = areas[r];
      a.semaphores = at;
      at = align_up(at + size_t(prog.semaphores) * sizeof(uint32_t), kPage);
      const size_t scratch = size_t(prog.scratch_chunks / plan_.chunk_factor) * size_t(block) * asize;
      if (scratch) {
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
  std::vector<bool> net_;             // per peer: reached over the network (another host), not shared memory
  std::shared_ptr<Mailbox> mailbox_;  // what network peers said about this call site's calls
  std::vector<std::vector<uint8_t>> chunks_;  // [rank * 2 + (input 0, output 1)]: per chunk, 1 if shared

  std::mutex mu_;  // guards what follows
  SharedSegment directory_;
  std::vector<SharedSegment> data_;       // per slot
  std::vector<uint64_t> data_ids_;        // per slot
  std::vector<SharedSegment> peer_dirs_;  // per peer
  // Per peer: its calls (launch id, count) that a call of another launch here was matched with (kCrossedAfter),
  // newest last. Its slot of such a call is no match for this process's call of that launch, done though it is.
  std::vector<std::deque<std::pair<int64_t, uint64_t>>> consumed_;
  std::vector<SharedSegment> peer_data_;  // per peer * kSlots + slot
  std::vector<uint64_t> peer_data_ids_;
  std::vector<std::map<int64_t, uint64_t>> iterations_;  // per local rank: run id -> calls in that launch
  std::vector<std::shared_ptr<SpanCall>> active_;

  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mu_;
  std::string failure_;
};

SpanningCommunicator::~SpanningCommunicator() {
  unwatch(this);
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    auto it = reg.comms.find({callsite_, group_});
    if (it != reg.comms.end() && it->second.expired()) reg.comms.erase(it);
  }
  Mailboxes& m = mailboxes();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.boxes.find({callsite_, group_});
  if (it != m.boxes.end() && it->second == mailbox_) m.boxes.erase(it);
}

namespace {
std::atomic<uint64_t> next_data_id{1};
constexpr int32_t kNotFound = -1, kOverNetwork = -2;  // a peer's slot: not found yet, or none (network peer)
}

// The ranks of one network peer in one call: reads, writes and signals become messages naming the call.
class NetRanks : public RemoteRanks {
 public:
  NetRanks(int32_t process, std::string who, std::string stalled, int64_t callsite, int32_t group, int64_t run_id, uint64_t iteration,
           Clock::time_point deadline)
      : process_(process), who_(std::move(who)), stalled_(std::move(stalled)), deadline_(deadline) {
    base_.callsite = callsite;
    base_.group = group;
    base_.run_id = run_id;  // the peer's launch id for the call (its own, where launches crossed)
    base_.iteration = iteration;
  }
  std::unique_ptr<Read> begin_read(const ChunkRef& ref, void* dst, size_t bytes) override {
    return std::make_unique<NetRanksRead>(*this, net_request(process_, addressed(NetMessage::kGet, ref, 0), dst,
                                                             bytes));
  }
  Status write(const ChunkRef& ref, const void* src, size_t bytes) override {
    if (!net_send(process_, addressed(NetMessage::kPut, ref, bytes), src)) return gone();
    return {};
  }
  Status signal(int32_t rank, int32_t sem) override {
    NetMessage m = base_;
    m.type = NetMessage::kSignal;
    m.rank = rank;
    m.sem = sem;
    if (!net_send(process_, m, nullptr)) return gone();
    return {};
  }

 private:
  NetMessage addressed(uint32_t type, const ChunkRef& ref, size_t bytes) const {
    NetMessage m = base_;
    m.type = type;
    m.rank = ref.rank;
    m.buffer = static_cast<int32_t>(ref.buffer);
    m.index = ref.index;
    m.count = ref.count;
    m.bytes = bytes;
    return m;
  }
  Status gone() const {
    return Status::Error(who_ + " has gone: its network connection broke; its ranks will never finish their steps");
  }
  class NetRanksRead : public Read {
   public:
    NetRanksRead(const NetRanks& ranks, std::shared_ptr<NetRead> read) : ranks_(ranks), read_(std::move(read)) {}
    Status finish() override {
      Status st = net_await(*read_, ranks_.deadline_);
      if (!st.ok() && !net_alive(ranks_.process_)) return ranks_.gone();
      if (!st.ok() && Clock::now() >= ranks_.deadline_)
        return Status::Error(ranks_.stalled_ + "; it did not answer a read");
      return st;
    }

   private:
    const NetRanks& ranks_;
    std::shared_ptr<NetRead> read_;
  };
  int32_t process_;
  std::string who_;
  std::string stalled_;  // the error when it answers nothing until the deadline (describe_stalled)
  Clock::time_point deadline_;
  NetMessage base_;
};

// One call of a spanning group in this process: what its local ranks published and what the worker needs.
class SpanCall : public CallFailure {
 public:
  SpanCall(SpanningCommunicator& comm, int64_t run_id, uint64_t iteration, int32_t slot, int64_t block, DType dtype,
           const CallSite& site, Clock::time_point deadline)
      : comm_(comm), owner_(comm.shared_from_this()), run_id_(run_id), iteration_(iteration), slot_(slot), block_(block), dtype_(dtype), site_(site),
        deadline_(deadline), buffers_(comm.local_.size()), copy_out_(comm.local_.size()),
        completions_(comm.local_.size()), handoff_(std::make_unique<std::atomic<int>[]>(comm.local_.size())),
        arrived_ranks_(comm.local_.size(), false),
        peer_slot_(comm.peers_.size(), kNotFound), peer_generation_(comm.peers_.size(), 0),
        peer_run_id_(comm.peers_.size(), run_id), crossed_run_(comm.peers_.size(), run_id),
        crossed_since_(comm.peers_.size()),
        net_ranks_(comm.peers_.size()) {}

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
      for (size_t i = 0; i < comm_.peers_.size(); ++i)
        if (comm_.net_[i]) {
          NetMessage m = net_message(NetMessage::kFailed, i);
          m.bytes = message.size();
          net_send(comm_.peers_[i], m, message.data());
        }
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
      const bool alive = process_alive(p);
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
    std::string why;
    if (comm_.net_[i]) {
      std::lock_guard<std::mutex> lock(comm_.mailbox_->mu);
      auto it = comm_.mailbox_->failed.find({comm_.peers_[i], run_id_, iteration_});
      if (it != comm_.mailbox_->failed.end()) why = it->second;
    } else if (peer_slot_[i] >= 0) {
      SlotHeader& h = peer_header(i, peer_slot_[i]);
      const uint64_t st = h.state.load(std::memory_order_acquire);
      if (generation_of(st) == peer_generation_[i] && phase_of(st) == kFailed)
        why.assign(h.message, strnlen(h.message, sizeof(h.message)));
    }
    if (why.empty()) return why;
    return site_.describe() + ": " + comm_.describe_process(comm_.peers_[i]) + " failed this call: " + why;
  }
  // The first peer's failure of this call (peer_failure), or "". With `gone_only`, only of a peer that has
  // left: a peer still here may be echoing this process's own failure.
  std::string any_peer_failure(bool gone_only = false) {
    for (size_t i = 0; i < comm_.peers_.size(); ++i) {
      if (gone_only && process_alive(comm_.peers_[i])) continue;
      if (std::string why = peer_failure(i); !why.empty()) return why;
    }
    return {};
  }
  // Every message queued to network peers so far on the wire, or `deadline`: what this process said of a call
  // must outlive it, since it may exit as soon as the call returns.
  bool flush_network_peers(Clock::time_point deadline) {
    bool all = true;
    for (size_t i = 0; i < comm_.peers_.size(); ++i) {
      const int32_t p = comm_.peers_[i];
      if (comm_.net_[i] && !net_flush(p, deadline) && net_alive(p)) all = false;
    }
    return all;
  }

  SlotHeader& header() { return comm_.directory().slots[slot_]; }
  // A message about this call to network peer i (its publication to every peer); it names the call by the peer's
  // launch id once matched (they differ where launches crossed), so the peer finds it as its own.
  NetMessage net_message(uint32_t type, size_t i = SIZE_MAX) const {
    NetMessage m;
    m.type = type;
    m.callsite = comm_.callsite_;
    m.group = comm_.group_;
    m.run_id = i == SIZE_MAX ? run_id_ : peer_run_id_[i];
    m.iteration = iteration_;
    m.block = block_;
    m.dtype = static_cast<int32_t>(dtype_);
    m.fingerprint = comm_.fingerprint_;
    m.elements = comm_.elements_;
    return m;
  }
  void tell_network_peers(uint32_t type) {
    for (size_t i = 0; i < comm_.peers_.size(); ++i)
      if (comm_.net_[i]) net_send(comm_.peers_[i], net_message(type, type == NetMessage::kPublish ? SIZE_MAX : i),
                                  nullptr);
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
  // Whether peer process i has finished this call's steps (its ranks touch no buffer of the call any more).
  bool peer_done(size_t i) {
    if (comm_.net_[i]) {
      std::lock_guard<std::mutex> lock(comm_.mailbox_->mu);
      return comm_.mailbox_->done.count({comm_.peers_[i], run_id_, iteration_}) != 0;
    }
    if (peer_slot_[i] < 0) return false;
    const uint64_t s = peer_header(i, peer_slot_[i]).state.load(std::memory_order_acquire);
    return generation_of(s) == peer_generation_[i] && phase_of(s) == kDone;
  }
  SlotHeader& peer_header(size_t i, int32_t slot) {
    return static_cast<Directory*>(comm_.peer_dirs_[i].data())->slots[slot];
  }
  void ring_peers() {
    for (size_t i = 0; i < comm_.peers_.size(); ++i)
      if (peer_slot_[i] >= 0) peer_header(i, peer_slot_[i]).bell.ring();
  }

  SpanningCommunicator& comm_;
  const std::shared_ptr<SpanningCommunicator> owner_;  // a call in flight keeps its call site's segments
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
  bool arrived(size_t i) {
    std::lock_guard<std::mutex> lock(comm_.mu_);
    return arrived_ranks_[i];
  }
  Status status_;
  Doorbell finished_;
  std::vector<int32_t> peer_slot_;  // per peer: the slot holding this call once found (kOverNetwork: no slot)
  std::vector<uint64_t> peer_generation_;
  std::vector<int64_t> peer_run_id_;  // per peer: its launch id for this call (this one's, unless launches crossed)
  std::vector<int64_t> crossed_run_;  // per peer: the other launch it published alone, since crossed_since_
  std::vector<Clock::time_point> crossed_since_;
  std::vector<std::unique_ptr<NetRanks>> net_ranks_;  // per peer reached over the network
  std::atomic<bool> told_failure_{false};
  Clock::time_point last_poll_{};
};

namespace {

// Find peer i's slot for the call; true once found (peer_slot_ set). Opens the peer's directory on first use and
// checks its fingerprint.
Status find_peer(SpanCall& call, size_t i, bool& found) {
  SpanningCommunicator& c = call.comm_;
  const int32_t p = c.peers_[i];
  found = false;
  SharedSegment& dir = c.peer_dirs_[i];
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
    const size_t k = i * kSlots + size_t(s);
    if (c.peer_data_ids_[k] != data_id || !c.peer_data_[k].mapped()) {
      SharedSegment::Opened opened;
      Status st = SharedSegment::open(c.data_name(p, data_id), c.peer_data_[k], opened);
      if (!st.ok()) return st;
      if (opened == SharedSegment::Opened::kNotYet)
        return Status::Error(call.site_.describe() + ": the data segment of " + c.describe_process(p) +
                             " is gone (" + c.data_name(p, data_id) + ")");
      c.peer_data_ids_[k] = data_id;
    }
    size_t bytes = 0;
    c.layout(p, call.block_, call.dtype_, bytes);
    if (c.peer_data_[k].size() < bytes)
      return Status::Error(call.site_.describe() + ": the data segment of " + c.describe_process(p) + " holds " +
                           std::to_string(c.peer_data_[k].size()) + " bytes, the call needs " +
                           std::to_string(bytes));
    call.peer_slot_[i] = s;
    call.peer_generation_[i] = generation_of(st1);
    call.peer_run_id_[i] = seen.run_id;
    if (seen.run_id != call.run_id_) {
      c.consumed_[i].emplace_back(seen.run_id, call.iteration_);
      if (c.consumed_[i].size() > kCrossedKept) c.consumed_[i].pop_front();
    }
    found = true;
    return Status{};
  };
  Seen other;  // the peer's one published call of another launch at this call's count, if exactly one
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
    const std::pair<int64_t, uint64_t> key{seen.run_id, iteration};
    if (std::find(c.consumed_[i].begin(), c.consumed_[i].end(), key) != c.consumed_[i].end()) continue;
    if (seen.run_id == call.run_id_) return take(seen);
    if (ph == kPublished) {
      other = seen;
      ++others;
    }
  }
  if (others == 1 && call.crossed(i, other.run_id)) return take(other);
  if (others != 1) call.crossed(i, call.run_id_);  // nothing crossed: start over
  return {};
}

// Find network peer i's publication of the call in the mailbox; checks its plan and shapes like find_peer.
Status find_network_peer(SpanCall& call, size_t i, bool& found) {
  SpanningCommunicator& c = call.comm_;
  const int32_t p = c.peers_[i];
  NetMessage m;
  {
    std::lock_guard<std::mutex> lock(c.mailbox_->mu);
    auto it = c.mailbox_->published.find({p, call.run_id_, call.iteration_});
    found = it != c.mailbox_->published.end();
    if (!found) {
      // The peer's one publication of another launch at this call's count (kCrossedAfter); this process holds
      // no call of that launch (it holds only this one).
      auto other = c.mailbox_->published.end();
      int32_t others = 0;
      for (auto o = c.mailbox_->published.begin(); o != c.mailbox_->published.end(); ++o)
        if (std::get<0>(o->first) == p && std::get<2>(o->first) == call.iteration_ &&
            !c.mailbox_->done.count(o->first) && !c.mailbox_->failed.count(o->first)) {
          other = o;
          ++others;
        }
      if (others == 1 && call.crossed(i, std::get<1>(other->first))) {
        it = other;
        found = true;
      } else if (others != 1) {
        call.crossed(i, call.run_id_);
      }
    }
    if (found) {
      m = it->second;
      call.peer_run_id_[i] = m.run_id;
    } else if (auto f = c.mailbox_->sites.find(p); f != c.mailbox_->sites.end()) {
      // Another plan or shape at this call site runs in another executable, whose launches never match ours:
      // refuse it from any publication rather than wait for this one.
      m = f->second;
    } else {
      return {};
    }
  }
  if (std::string why = c.shape_differs(p, m.elements, m.dtype); !why.empty()) return Status::Error(why);
  if (m.fingerprint != c.fingerprint_)
    return Status::Error(call.site_.describe() + ": " + c.describe_process(p) +
                         " runs a different plan at this call site (plan fingerprint " + std::to_string(m.fingerprint) +
                         ", this process " + std::to_string(c.fingerprint_) +
                         "); every process must run the same program with the same jaxcoll version");
  if (!found) return {};
  if (m.block != call.block_ || m.dtype != static_cast<int32_t>(call.dtype_))
    return Status::Error(call.site_.describe() + ": " + c.describe_process(p) + " called with " +
                         std::to_string(m.block) + "-element blocks of " + dtype_name(static_cast<DType>(m.dtype)) +
                         ", this process with " + std::to_string(call.block_) + " of " + dtype_name(call.dtype_) +
                         "; every rank must pass the same shape");
  call.peer_slot_[i] = kOverNetwork;
  return {};
}

// The worker's part of a call: find the peers, run the local ranks' lanes, wait for every process to finish.
Status run_call(SpanCall& call) {
  SpanningCommunicator& c = call.comm_;
  SlotHeader& me = call.header();
  // 1. Every peer process's slot for this call.
  for (;;) {
    if (c.failed()) return Status::Error(c.failure());
    const uint32_t seen = me.bell.word.load(std::memory_order_seq_cst);
    bool all = true;
    {
      std::lock_guard<std::mutex> lock(c.mu_);
      for (size_t i = 0; i < c.peers_.size(); ++i) {
        if (call.peer_slot_[i] != kNotFound) continue;
        bool found = false;
        Status st = c.net_[i] ? find_network_peer(call, i, found) : find_peer(call, i, found);
        if (found && c.net_[i]) continue;
        if (!st.ok()) return st;
        if (found) call.peer_header(i, call.peer_slot_[i]).bell.ring();  // it may be waiting for us
        all &= found;
      }
    }
    if (all) break;
    call.poll();
    if (c.failed()) return Status::Error(c.failure());
    if (Clock::now() >= call.deadline_) {
      // A peer that failed the call is why (this process may have been the one stopped past its deadline).
      if (std::string cause = call.any_peer_failure(); !cause.empty()) return Status::Error(cause);
      std::string missing;
      for (size_t i = 0; i < c.peers_.size(); ++i)
        if (call.peer_slot_[i] == kNotFound)
          missing += (missing.empty() ? "" : "; ") + c.describe_process(c.peers_[i]);
      return Status::Error(call.site_.describe() + ": timed out waiting for every process to arrive (launch " +
                           std::to_string(call.run_id_) + ", call " + std::to_string(call.iteration_) +
                           " of this site in it); never arrived: " + missing +
                           " (timeout set by JAXCOLL_TIMEOUT; a process that never arrives usually ran a different "
                           "program or failed before this collective)");
    }
    wait_for(me.bell, [&] { return me.bell.word.load(std::memory_order_seq_cst) != seen; },
             [&] { return c.failed(); }, std::min(call.deadline_, Clock::now() + std::chrono::milliseconds(20)));
  }

  // A peer may have failed the call before this process arrived: no step runs with it.
  if (const std::string cause = call.any_peer_failure(); !cause.empty()) return Status::Error(cause);

  // 2. The local ranks' lanes, every rank addressed where this process reaches it.
  std::vector<PeerView> views(c.plan_.nranks);
  for (int32_t r : c.local_) views[r] = call.local_views_[c.local_index_[r]];
  for (size_t i = 0; i < c.peers_.size(); ++i) {
    const int32_t p = c.peers_[i];
    if (c.net_[i]) {
      call.net_ranks_[i] = std::make_unique<NetRanks>(p, c.describe_process(p), call.site_.describe() + ": " +
                                                      c.describe_stalled(p), c.callsite_, c.group_, call.peer_run_id_[i],
                                                      call.iteration_, call.deadline_);
      for (int32_t r : c.ranks_of(p)) views[r].remote = call.net_ranks_[i].get();
      continue;
    }
    size_t bytes = 0;
    const std::vector<RankArea> areas = c.layout(p, call.block_, call.dtype_, bytes);
    char* base = static_cast<char*>(c.peer_data_[i * kSlots + size_t(call.peer_slot_[i])].data());
    SlotHeader& h = call.peer_header(i, call.peer_slot_[i]);
    for (int32_t r : c.ranks_of(p)) {
      const RankArea& a = areas[r];
      auto at = [&](size_t off) -> void* { return off == kPrivate ? nullptr : base + off; };
      PeerView& v = views[r];
      v = {at(a.input), at(a.output), at(a.scratch), reinterpret_cast<std::atomic<uint32_t>*>(base + a.semaphores),
           &h.bell};
      // An in-place plan's input is a block of its output (all_gather) or the reverse (reduce_scatter), as the
      // owner staged it.
      const int64_t block_bytes = call.block_ * int64_t(dtype_size(call.dtype_));
      if (c.plan_.in_place && v.input && c.plan_.collective == Collective::kAllGather)
        v.input = static_cast<char*>(v.output) + r * block_bytes;
      if (c.plan_.in_place && v.input && c.plan_.collective == Collective::kReduceScatter)
        v.output = static_cast<char*>(v.input) + r * block_bytes;
    }
  }
  Status st;
  {
    const CallBuffers& b = call.buffers_[0];
    auto group = std::make_shared<GroupRun>(std::move(views), c.local_, c.plan_, b, call.site_, call.deadline_,
                                            call.block_, me.bell, call, /*whole_group=*/false);
    // Larger calls are shared with helpers, one per core this process may use beyond the worker's own (the
    // host's cores split among the job's processes on it); small ones cost more to wake helpers for.
    if (call_traffic_bytes(c.plan_, call.block_, call.dtype_) > solo_bytes()) {
      const int n = std::min<int>(helpers_per_call(c.world_), static_cast<int>(c.local_.size()) - 1);
      for (int h = 0; h < n; ++h)
        run_on_worker([group, start = (h + 1) * group->nruns() / (n + 1)] { group->help(start); });
    }
    st = group->lead();
  }
  // A peer that failed the call and left shows here first as a broken read or write: name its reason instead.
  if (!st.ok()) {
    const std::string cause = call.any_peer_failure(/*gone_only=*/true);
    return cause.empty() ? st : Status::Error(cause);
  }

  // 3. Done here; wait until every peer is done with its steps (they may still read this process's buffers).
  me.state.store((generation_of(me.state.load(std::memory_order_relaxed)) << 3) | kDone, std::memory_order_release);
  call.ring_peers();
  call.tell_network_peers(NetMessage::kDone);
  for (;;) {
    const uint32_t seen = me.bell.word.load(std::memory_order_seq_cst);
    bool all = true;
    for (size_t i = 0; i < c.peers_.size() && all; ++i) all = call.peer_done(i);
    if (all) break;
    call.poll();
    if (c.failed()) return Status::Error(c.failure());
    if (Clock::now() >= call.deadline_) {
      std::string stalled;
      for (size_t i = 0; i < c.peers_.size(); ++i)
        if (!call.peer_done(i)) stalled += "; " + c.describe_stalled(c.peers_[i]);
      return Status::Error(call.site_.describe() + ": timed out waiting for the other processes to finish the call" +
                           stalled);
    }
    wait_for(me.bell, [&] { return me.bell.word.load(std::memory_order_seq_cst) != seen; },
             [&] { return c.failed(); }, std::min(call.deadline_, Clock::now() + std::chrono::milliseconds(20)));
  }

  // 4. This process may exit as soon as the call returns: its done must be on the wire by then, not in the
  // sender's queue, or a network peer still waiting for it would see the connection close instead.
  if (!call.flush_network_peers(call.deadline_))
    return Status::Error(call.site_.describe() + ": timed out handing the end of the call to the other processes "
                         "(a connection takes no data)");
  return {};
}

}  // namespace

// After the call: outputs back to XLA's buffers, peers' slots acknowledged, local ranks completed.
void finish_call(const std::shared_ptr<SpanCall>& call, Status st) {
  SpanningCommunicator& c = call->comm_;
  if (!st.ok()) {
    call->fail(st.message());
    // Its peers learn why from this process, not from its exit, if the program stops on the error (a second
    // at most: a connection that takes no data is a peer that will time out on its own).
    call->flush_network_peers(Clock::now() + std::chrono::seconds(1));
  } else {
    for (const auto& outs : call->copy_out_)
      for (const CopyOut& out : outs) std::memcpy(out.dst, out.src, out.bytes);
    for (size_t i = 0; i < c.peers_.size(); ++i)
      if (call->peer_slot_[i] >= 0) call->peer_header(i, call->peer_slot_[i]).acks.fetch_add(1);
  }
  {
    // What network peers said of this call is spent.
    std::lock_guard<std::mutex> lock(c.mailbox_->mu);
    // (Its publication is under its launch id; what it said since, under this process's. Where launches crossed,
    // its publication under this launch id is of another call, which a later call here is matched with.)
    for (size_t i = 0; i < c.peers_.size(); ++i) {
      c.mailbox_->published.erase({c.peers_[i], call->peer_run_id_[i], call->iteration_});
      c.mailbox_->done.erase({c.peers_[i], call->run_id_, call->iteration_});
    }
  }
  call->status_ = st;
  std::vector<Completion> owed;
  {
    std::lock_guard<std::mutex> lock(c.mu_);
    c.active_.erase(std::remove(c.active_.begin(), c.active_.end(), call), c.active_.end());
    for (size_t i = 0; i < c.local_.size(); ++i) {
      int expected = SpanCall::kWaiting;
      if (call->handoff_[i].compare_exchange_strong(expected, SpanCall::kInline, std::memory_order_acq_rel))
        call->completions_[i] = nullptr;  // finished on its own thread
      else
        owed.push_back(std::move(call->completions_[i]));
    }
  }
  call->finished_.ring();
  // Each completion on its own worker: one may resume an XLA program that waits for the others.
  for (Completion& done : owed)
    run_on_worker([done = std::move(done), st]() mutable { done(st); });
}

bool SpanningCommunicator::expire(Clock::time_point now, std::vector<Completion>& pending, Status& error) {
  (void)pending;
  (void)error;
  std::vector<std::shared_ptr<SpanCall>> expired;
  bool gathering = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& call : active_) {
      if (call->arrived_ == static_cast<int32_t>(local_.size())) continue;
      if (now < call->deadline_) {
        gathering = true;
        continue;
      }
      expired.push_back(call);
    }
  }
  for (auto& call : expired) {
    std::string missing;
    for (size_t i = 0; i < local_.size(); ++i)
      if (!call->arrived(i)) missing += (missing.empty() ? "" : ", ") + std::to_string(local_[i]);
    // On a worker: the watchdog holds its lock here, and a call may hold the last reference to its call site.
    const Status st = Status::Error(call->site_.describe() + ": timed out waiting for this process's ranks to "
                                    "arrive (launch " + std::to_string(call->run_id_) + ", call " +
                                    std::to_string(call->iteration_) + " of this site in it); ranks that never "
                                    "arrived: [" + missing + "] (timeout set by JAXCOLL_TIMEOUT; a rank that never "
                                    "arrives usually ran a different program or failed before this collective)");
    run_on_worker([call, st] { finish_call(call, st); });
  }
  return gathering;
}

namespace {

// A free slot of this process's directory (its last call acknowledged by every peer), claimed for a call.
int32_t claim_slot(SpanningCommunicator& c) {
  Directory& d = c.directory();
  const uint32_t npeers = static_cast<uint32_t>(std::count(c.net_.begin(), c.net_.end(), false));
  for (int32_t s = 0; s < kSlots; ++s) {
    SlotHeader& h = d.slots[s];
    const uint64_t st = h.state.load(std::memory_order_acquire);
    const uint64_t ph = phase_of(st);
    if (ph == kFree || (ph == kDone && h.acks.load(std::memory_order_acquire) == npeers)) {
      bool busy = false;
      for (auto& a : c.active_) busy |= a->slot_ == s;
      if (busy) continue;
      h.acks.store(0, std::memory_order_relaxed);
      h.state.store(((generation_of(st) + 1) << 3) | kFilling, std::memory_order_release);
      return s;
    }
  }
  return -1;
}

}  // namespace

namespace {

std::shared_ptr<SpanningCommunicator> find_communicator(int64_t callsite, int32_t group) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.comms.find({callsite, group});
  return it == reg.comms.end() ? nullptr : it->second.lock();
}

std::shared_ptr<SpanCall> find_call(SpanningCommunicator& c, int64_t run_id, uint64_t iteration) {
  std::lock_guard<std::mutex> lock(c.mu_);
  for (auto& a : c.active_)
    if (a->run_id_ == run_id && a->iteration_ == iteration) return a;
  return nullptr;
}

// The local chunk a signal, put or get from a network peer addresses, or an error naming what is wrong.
struct Addressed {
  std::shared_ptr<SpanningCommunicator> comm;
  std::shared_ptr<SpanCall> call;
  const PeerView* view = nullptr;
  void* at = nullptr;  // put, get: the chunk's first byte
  size_t bytes = 0;    // put, get: the chunk's bytes
};

bool address(const NetMessage& m, Addressed& a) {
  // Signals, puts and gets come only after the sender found this process's publication of the call.
  a.comm = find_communicator(m.callsite, m.group);
  SpanningCommunicator* c = a.comm.get();
  a.call = c ? find_call(*c, m.run_id, m.iteration) : nullptr;
  if (!a.call || m.rank < 0 || m.rank >= c->plan_.nranks || c->local_index_[m.rank] < 0) return false;
  a.view = &a.call->local_views_[c->local_index_[m.rank]];
  if (m.type == NetMessage::kSignal) return true;
  const ChunkRef ref{m.rank, static_cast<BufferKind>(m.buffer), m.index, m.count};
  const int64_t k = c->plan_.chunk_factor;
  const ElementRange range = chunk_range(k, a.call->block_, ref.index, ref.count);
  const size_t esize = ref.buffer == BufferKind::kScratch ? accum_size(a.call->dtype_) : dtype_size(a.call->dtype_);
  a.bytes = size_t(range.size()) * esize;
  a.at = chunk_address(*a.view, ref, k, a.call->block_, dtype_size(a.call->dtype_), accum_size(a.call->dtype_));
  return true;
}

// Where a put's payload goes: straight into its chunk when the call is here and the sizes agree (otherwise the
// handler reports it from the payload).
void* place(const NetMessage& m) {
  if (m.type != NetMessage::kPut) return nullptr;
  Addressed a;
  return address(m, a) && a.bytes == m.bytes ? a.at : nullptr;
}

// A message from a network peer (net.hpp's receiver thread).
void on_message(const NetMessage& m, std::vector<char>& payload, bool placed) {
  const CallKey key{m.from, m.run_id, m.iteration};
  if (m.type == NetMessage::kPublish || m.type == NetMessage::kDone || m.type == NetMessage::kFailed) {
    {
      auto box = mailbox(m.callsite, m.group);
      std::lock_guard<std::mutex> lock(box->mu);
      if (m.type == NetMessage::kPublish) {
        box->published[key] = m;
        box->sites.emplace(m.from, m);
      }
      else if (m.type == NetMessage::kDone) box->done.insert(key);
      else box->failed[key] = std::string(payload.begin(), payload.end());
    }
    if (auto c = find_communicator(m.callsite, m.group))
      if (auto call = find_call(*c, m.run_id, m.iteration)) call->header().bell.ring();
    return;
  }
  Addressed a;
  if (!address(m, a)) {
    if (a.comm) a.comm->fail("jaxcoll callsite " + std::to_string(m.callsite) + ": process " +
                             std::to_string(m.from) + " addressed rank " + std::to_string(m.rank) +
                             " of a call this process does not hold");
    return;
  }
  if (m.type == NetMessage::kSignal) {
    a.view->semaphores[m.sem].fetch_add(1, std::memory_order_release);
    a.call->header().bell.ring();
  } else if (m.type == NetMessage::kPut) {
    if (!placed)
      a.call->fail(a.call->site_.describe() + ": process " + std::to_string(m.from) + " wrote " +
                   std::to_string(payload.size()) + " bytes into a chunk of " + std::to_string(a.bytes));
  } else if (m.type == NetMessage::kGet) {
    NetMessage answer;
    answer.type = NetMessage::kData;
    answer.request = m.request;
    answer.bytes = a.bytes;
    net_send(m.from, answer, a.at);
  }
}

}  // namespace

void serve_network() { net_set_handler(on_message, place); }

uint64_t plan_fingerprint(const int32_t* words, size_t nwords, int32_t reduce_op) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint32_t w) {
    for (int i = 0; i < 4; ++i) {
      h ^= (w >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (size_t i = 0; i < nwords; ++i) mix(static_cast<uint32_t>(words[i]));
  mix(static_cast<uint32_t>(reduce_op));
  return h;
}

std::shared_ptr<SpanningCommunicator> spanning_communicator_for(int64_t callsite, int32_t group, const Plan& plan,
                                                               const std::vector<int32_t>& processes,
                                                               uint64_t fingerprint, int64_t elements, DType dtype,
                                                               Status& status) {
  const World* w = world();
  if (!w) {
    status = Status::Error("jaxcoll callsite " + std::to_string(callsite) +
                           ": this group spans several processes, but jaxcoll's multi-process runtime is not set "
                           "up in this process (jaxcoll.distributed.connect() runs when a collective over a mesh "
                           "of several processes is lowered, after jax.distributed.initialize)");
    return nullptr;
  }
  for (int32_t p : processes)
    if (p < 0 || p >= w->nprocesses()) {
      status = Status::Error("jaxcoll callsite " + std::to_string(callsite) + ": the plan names process " +
                             std::to_string(p) + ", but the job has " + std::to_string(w->nprocesses()));
      return nullptr;
    }
  Registry& reg = registry();
  std::unique_lock<std::mutex> lock(reg.mu);
  if (auto c = reg.comms[{callsite, group}].lock()) return c;
  auto made = std::make_shared<SpanningCommunicator>(callsite, group, plan, processes, fingerprint, elements, dtype,
                                                     *w);
  made->iterations_.resize(made->local_.size());
  status = made->open_directory();
  if (!status.ok()) {
    reg.comms.erase({callsite, group});
    lock.unlock();  // its destructor takes the registry's lock
    return nullptr;
  }
  reg.comms[{callsite, group}] = made;
  return made;
}

Status execute_spanning_rank(SpanningCommunicator& c, int64_t run_id, const Plan& plan, int32_t rank,
                             const CallBuffers& b, const CallSite& site, double timeout_s, Completion completion,
                             bool& pending) {
  pending = false;
  if (c.failed())
    return Status::Error(site.describe() + ": an earlier call of this collective failed and left its peers in an "
                         "unknown state; restart the job. The failure was: " + c.failure());
  const int32_t li = (rank >= 0 && rank < plan.nranks) ? c.local_index_[rank] : -1;
  if (li < 0)
    return Status::Error(site.describe() + ": rank " + std::to_string(rank) + " is not hosted by process " +
                         std::to_string(c.me_) + " (the plan's process map puts it elsewhere)");
  if (b.input_elements % plan.in_blocks)
    return Status::Error(site.describe() + ": rank " + std::to_string(rank) + ": input of " +
                         std::to_string(b.input_elements) + " elements does not split into the plan's in_blocks=" +
                         std::to_string(plan.in_blocks) + " blocks");
  const int64_t block = b.input_elements / plan.in_blocks;
  if (b.output_elements != block * plan.out_blocks)
    return Status::Error(site.describe() + ": rank " + std::to_string(rank) + ": output has " +
                         std::to_string(b.output_elements) + " elements, the plan needs out_blocks*block=" +
                         std::to_string(plan.out_blocks) + "*" + std::to_string(block));
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  const size_t dsize = dtype_size(b.dtype);
  if (env_settings().trace) std::fprintf(stderr, "jaxcoll trace: rank %d joins launch %lld\n", rank, (long long)run_id);

  // Join (or open) the call: the first local rank claims a slot and sizes its data segment.
  std::shared_ptr<SpanCall> call;
  {
    std::lock_guard<std::mutex> lock(c.mu_);
    if (c.failed()) return Status::Error(site.describe() + ": " + c.failure());
    auto& iters = c.iterations_[li];
    const uint64_t iteration = ++iters[run_id];
    if (iters.size() > 64) iters.erase(iters.begin());
    for (auto& a : c.active_)
      if (a->run_id_ == run_id && a->iteration_ == iteration) call = a;
    if (!call) {
      const int32_t slot = claim_slot(c);
      if (slot < 0)
        return Status::Error(site.describe() + ": more than " + std::to_string(kSlots) +
                             " calls of this collective are in flight in this process");
      size_t bytes = 0;
      c.layout(c.me_, block, b.dtype, bytes);
      if (c.data_[slot].size() < bytes) {
        const uint64_t id = next_data_id.fetch_add(1);
        Status st = SharedSegment::create(c.data_name(c.me_, id), align_up(bytes, size_t(2) << 20), c.data_[slot]);
        if (!st.ok()) return st;
        c.data_ids_[slot] = id;
      }
      call = std::make_shared<SpanCall>(c, run_id, iteration, slot, block, b.dtype, site, deadline);
      call->staging_.resize(c.local_.size());
      // Views of the local ranks into this call's data segment (XLA's buffers are filled in as ranks arrive).
      const std::vector<RankArea> areas = c.layout(c.me_, block, b.dtype, bytes);
      char* base = static_cast<char*>(c.data_[slot].data());
      call->local_views_.resize(c.local_.size());
      for (size_t i = 0; i < c.local_.size(); ++i) {
        const RankArea& a = areas[c.local_[i]];
        PeerView& v = call->local_views_[i];
        v.semaphores = reinterpret_cast<std::atomic<uint32_t>*>(base + a.semaphores);
        v.bell = &call->header().bell;
        v.scratch = a.scratch == kPrivate ? nullptr : base + a.scratch;
        v.shared_input = a.input == kPrivate ? nullptr : base + a.input;
        v.shared_output = a.output == kPrivate ? nullptr : base + a.output;
        v.input_chunks = v.shared_input ? c.chunk_flags(c.local_[i], BufferKind::kInput).data() : nullptr;
        v.output_chunks = v.shared_output ? c.chunk_flags(c.local_[i], BufferKind::kOutput).data() : nullptr;
      }
      c.active_.push_back(call);
    }
  }
  // A rank with another shape fails the call, but still arrives: the call's other ranks learn of it as it ends.
  const bool mismatch = call->block_ != block || call->dtype_ != b.dtype;
  if (mismatch)
    call->fail(site.describe() + ": rank " + std::to_string(rank) + " called with " + std::to_string(block) +
               "-element blocks of " + dtype_name(b.dtype) + ", another rank of this process with " +
               std::to_string(call->block_) + " of " + dtype_name(call->dtype_) +
               "; every rank must pass the same shape");

  // Stage this rank's buffers as the plan's arrangement and the sharing need (outside the lock: ranks in parallel).
  PeerView& v = call->local_views_[li];
  const RankProgram& prog = plan.ranks[rank];
  std::vector<CopyOut> copy_out;
  if (!mismatch) {
    std::memset(static_cast<void*>(v.semaphores), 0, size_t(prog.semaphores) * sizeof(uint32_t));
    const size_t in_bytes = size_t(b.input_elements) * dsize, out_bytes = size_t(b.output_elements) * dsize;
    if (!plan.in_place) {
      // XLA's buffers, with the shared chunks in the copies peers reach: inputs copied in now, outputs back after.
      v.input = const_cast<void*>(b.input);
      v.output = b.output;
      if (v.shared_input)
        for_each_run(c.chunk_flags(rank, BufferKind::kInput), plan.chunk_factor, block, dsize,
                     [&](size_t offset, size_t bytes) {
                       std::memcpy(static_cast<char*>(v.shared_input) + offset,
                                   static_cast<const char*>(b.input) + offset, bytes);
                     });
      if (v.shared_output)
        for_each_run(c.chunk_flags(rank, BufferKind::kOutput), plan.chunk_factor, block, dsize,
                     [&](size_t offset, size_t bytes) {
                       copy_out.push_back({static_cast<char*>(b.output) + offset,
                                           static_cast<char*>(v.shared_output) + offset, bytes});
                     });
    } else {
      // In-place plans share input and output whole (v.shared_output is their one copy), or not at all.
      const bool shared_io = v.shared_output != nullptr;
      v.input_chunks = v.output_chunks = nullptr;
      void* io = shared_io ? v.shared_output : b.output;
      if (plan.collective == Collective::kAllGather) {
        v.output = io;
        v.input = static_cast<char*>(io) + rank * block * int64_t(dsize);
        std::memcpy(v.input, b.input, block * dsize);
        if (shared_io) copy_out.push_back({b.output, io, out_bytes});
      } else if (plan.collective == Collective::kReduceScatter) {
        void* staging = shared_io ? io : call->staging_[li].reserve(in_bytes);
        if (!staging) {
          call->fail(site.describe() + ": out of memory for the in-place staging buffer");
        } else {
          std::memcpy(staging, b.input, in_bytes);
          v.input = staging;
          v.output = static_cast<char*>(staging) + rank * block * int64_t(dsize);
          copy_out.push_back({b.output, v.output, size_t(block) * dsize});
        }
      } else {
        if (io != b.input) std::memcpy(io, b.input, in_bytes);
        v.input = v.output = io;
        if (shared_io) copy_out.push_back({b.output, io, out_bytes});
      }
    }
    advise_huge_pages(b.output, out_bytes);
  }

  bool last = false;
  {
    std::lock_guard<std::mutex> lock(c.mu_);
    call->buffers_[li] = b;
    call->copy_out_[li] = std::move(copy_out);
    call->completions_[li] = std::move(completion);
    call->arrived_ranks_[li] = true;
    call->handoff_[li].store(SpanCall::kWaiting, std::memory_order_relaxed);
    last = ++call->arrived_ == static_cast<int32_t>(c.local_.size());
    if (last) {
      // Publish: peers may now find the call, map its segment and signal its semaphores.
      SlotHeader& h = call->header();
      h.run_id.store(run_id, std::memory_order_relaxed);
      h.iteration.store(call->iteration_, std::memory_order_relaxed);
      h.block.store(block, std::memory_order_relaxed);
      h.dtype.store(static_cast<int32_t>(b.dtype), std::memory_order_relaxed);
      h.data_id.store(c.data_ids_[call->slot_], std::memory_order_relaxed);
      h.state.store((generation_of(h.state.load(std::memory_order_relaxed)) << 3) | kPublished,
                    std::memory_order_release);
    }
  }
  if (last) {
    call->tell_network_peers(NetMessage::kPublish);
    run_on_worker([call] { finish_call(call, run_call(*call)); });
  }

  // Finish on this thread if the call is done soon (saves a worker hop), else return pending.
  std::atomic<int>& h = call->handoff_[li];
  wait_for(call->finished_, [&] { return h.load(std::memory_order_acquire) != SpanCall::kWaiting; },
           [] { return false; }, std::min(deadline, Clock::now() + sync_wait()));
  int expected = SpanCall::kWaiting;
  if (h.compare_exchange_strong(expected, SpanCall::kDeferred, std::memory_order_acq_rel)) {
    pending = true;
    watchdog_notify();
    return {};
  }
  return call->status_;
}

}  // namespace jaxcoll
