// The TCP transport: peer processes on other hosts (or every peer, with JAXCOLL_TRANSPORT=tcp), over the job's
// connections (net.hpp). A peer's ranks are messages naming the call: reads, writes and signals (NetRanks); what
// the peer did with a call (published, done, failed) comes as messages too, into the call site's mailbox,
// which the handler of every message from network peers (on_message) fills.
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <string>
#include <vector>

#include "csrc/cross_process_call.hpp"
#include "csrc/net.hpp"
#include "csrc/transport.hpp"
#include "csrc/world.hpp"

namespace jaxcoll {

namespace {

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

// The mailbox of (callsite, group), created on first use (by a message, or by a link to a network peer).
std::shared_ptr<Mailbox> mailbox(int64_t callsite, int32_t group) {
  Mailboxes& m = mailboxes();
  std::lock_guard<std::mutex> lock(m.mu);
  auto& box = m.boxes[{callsite, group}];
  if (!box) box = std::make_shared<Mailbox>();
  return box;
}

// The ranks of one network peer in one call: reads, writes and signals become messages naming the call.
class NetRanks : public RemoteRanks {
 public:
  NetRanks(int32_t process, std::string who, std::string stalled, int64_t callsite, int32_t group, int64_t run_id,
           uint64_t iteration, Clock::time_point deadline)
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

// A message about a call to a network peer; it names the call by the peer's launch id once matched (`run_id`:
// they differ where launches crossed), so the peer finds it as its own.
NetMessage call_message(const CrossProcessCall& call, uint32_t type, int64_t run_id) {
  const CrossProcessCommunicator& c = call.comm_;
  NetMessage m;
  m.type = type;
  m.callsite = c.callsite_;
  m.group = c.group_;
  m.run_id = run_id;
  m.iteration = call.iteration_;
  m.block = call.block_;
  m.dtype = static_cast<int32_t>(call.dtype_);
  m.fingerprint = c.fingerprint_;
  m.elements = c.elements_;
  return m;
}

// A peer process reached over its connection.
class TcpLink : public PeerLink {
 public:
  TcpLink(const CrossProcessCommunicator& comm, int32_t process)
      : callsite_(comm.callsite_), group_(comm.group_), process_(process), box_(mailbox(callsite_, group_)) {}
  // The call site is gone from this process: what its network peers said of it goes too.
  ~TcpLink() override {
    Mailboxes& m = mailboxes();
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.boxes.find({callsite_, group_});
    if (it != m.boxes.end() && it->second == box_) m.boxes.erase(it);
  }
  std::unique_ptr<PeerCall> join(CrossProcessCall& call, size_t peer) override;
  bool alive() const override { return net_alive(process_); }
  // Queued messages on the wire; a broken connection takes none, and nothing queued to it can matter any more.
  bool flush(Clock::time_point deadline) override { return net_flush(process_, deadline) || !net_alive(process_); }

 private:
  friend class TcpCall;
  const int64_t callsite_;
  const int32_t group_;
  const int32_t process_;
  const std::shared_ptr<Mailbox> box_;  // what network peers said about this call site's calls
};

// One call through a network peer: its publication of the call, found in the mailbox, and its ranks as messages.
class TcpCall : public PeerCall {
 public:
  TcpCall(TcpLink& link, CrossProcessCall& call, size_t peer)
      : box_(*link.box_), call_(call), i_(peer), process_(link.process_) {}

  // Find the peer's publication of the call in the mailbox; checks its plan and shapes as shm.cc does.
  Status find(bool& found) override {
    CrossProcessCommunicator& c = call_.comm_;
    CrossProcessCall& call = call_;
    const size_t i = i_;
    const int32_t p = c.peers_[i];
    found = false;
    NetMessage m;
    {
      std::lock_guard<std::mutex> lock(box_.mu);
      auto it = box_.published.find({p, call.run_id_, call.iteration_});
      found = it != box_.published.end();
      if (!found) {
        // The peer's one publication of another launch at this call's count (kCrossedAfter); this process holds
        // no call of that launch (it holds only this one).
        auto other = box_.published.end();
        int32_t others = 0;
        for (auto o = box_.published.begin(); o != box_.published.end(); ++o)
          if (std::get<0>(o->first) == p && std::get<2>(o->first) == call.iteration_ &&
              !box_.done.count(o->first) && !box_.failed.count(o->first)) {
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
      } else if (auto f = box_.sites.find(p); f != box_.sites.end()) {
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
                           " runs a different plan at this call site (plan fingerprint " +
                           std::to_string(m.fingerprint) + ", this process " + std::to_string(c.fingerprint_) +
                           "); every process must run the same program with the same jaxcoll version");
    if (!found) return {};
    if (m.block != call.block_ || m.dtype != static_cast<int32_t>(call.dtype_)) {
      found = false;
      return Status::Error(call.site_.describe() + ": " + c.describe_process(p) + " called with " +
                           std::to_string(m.block) + "-element blocks of " + dtype_name(static_cast<DType>(m.dtype)) +
                           ", this process with " + std::to_string(call.block_) + " of " + dtype_name(call.dtype_) +
                           "; every rank must pass the same shape");
    }
    return {};
  }

  void address(std::vector<PeerView>& views) override {
    CrossProcessCommunicator& c = call_.comm_;
    ranks_ = std::make_unique<NetRanks>(process_, c.describe_process(process_),
                                        call_.site_.describe() + ": " + c.describe_stalled(process_), c.callsite_,
                                        c.group_, call_.peer_run_id_[i_], call_.iteration_, call_.deadline_);
    for (int32_t r : c.ranks_of(process_)) views[r].remote = ranks_.get();
  }

  void wake() override {}  // a message wakes the peer's worker (on_message rings its slot's doorbell)
  void tell(Event event, const std::string& why) override {
    if (event == Event::kPublished) {  // under this process's launch id: the peer matches it with its own
      net_send(process_, call_message(call_, NetMessage::kPublish, call_.run_id_), nullptr);
      return;
    }
    NetMessage m = call_message(call_, event == Event::kDone ? NetMessage::kDone : NetMessage::kFailed,
                                call_.peer_run_id_[i_]);
    m.bytes = why.size();
    net_send(process_, m, why.empty() ? nullptr : why.data());
  }

  std::string failure() override {
    std::lock_guard<std::mutex> lock(box_.mu);
    auto it = box_.failed.find({process_, call_.run_id_, call_.iteration_});
    return it == box_.failed.end() ? std::string() : it->second;
  }
  bool done() override {
    std::lock_guard<std::mutex> lock(box_.mu);
    return box_.done.count({process_, call_.run_id_, call_.iteration_}) != 0;
  }
  // What the peer said of this call is spent. (Its publication is under its launch id; what it said since, under
  // this process's. Where launches crossed, its publication under this launch id is of another call, which a
  // later call here is matched with.)
  void finish(bool) override {
    std::lock_guard<std::mutex> lock(box_.mu);
    box_.published.erase({process_, call_.peer_run_id_[i_], call_.iteration_});
    box_.done.erase({process_, call_.run_id_, call_.iteration_});
  }

 private:
  Mailbox& box_;
  CrossProcessCall& call_;
  const size_t i_;
  const int32_t process_;
  std::unique_ptr<NetRanks> ranks_;  // once addressed: the peer's ranks, as the call's lanes reach them
};

std::unique_ptr<PeerCall> TcpLink::join(CrossProcessCall& call, size_t peer) {
  return std::make_unique<TcpCall>(*this, call, peer);
}

// Every process of the job has a connection to every process of another host (jaxcoll.distributed), and to every
// other process with JAXCOLL_TRANSPORT=tcp (each then on a host of its own).
bool reaches_any(const World&, int32_t, int32_t) { return true; }

std::unique_ptr<PeerLink> tcp_link(CrossProcessCommunicator& comm, size_t peer) {
  return std::make_unique<TcpLink>(comm, comm.peers_[peer]);
}

std::shared_ptr<CrossProcessCommunicator> find_communicator(int64_t callsite, int32_t group) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.comms.find({callsite, group});
  return it == reg.comms.end() ? nullptr : it->second.lock();
}

std::shared_ptr<CrossProcessCall> find_call(CrossProcessCommunicator& c, int64_t run_id, uint64_t iteration) {
  std::lock_guard<std::mutex> lock(c.mu_);
  for (auto& a : c.active_)
    if (a->run_id_ == run_id && a->iteration_ == iteration) return a;
  return nullptr;
}

// The local chunk a signal, put or get from a network peer addresses, or an error naming what is wrong.
struct Addressed {
  std::shared_ptr<CrossProcessCommunicator> comm;
  std::shared_ptr<CrossProcessCall> call;
  const PeerView* view = nullptr;
  void* at = nullptr;  // put, get: the chunk's first byte
  size_t bytes = 0;    // put, get: the chunk's bytes
};

bool address(const NetMessage& m, Addressed& a) {
  // Signals, puts and gets come only after the sender found this process's publication of the call.
  a.comm = find_communicator(m.callsite, m.group);
  CrossProcessCommunicator* c = a.comm.get();
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

extern const Transport tcp_transport{"tcp", reaches_any, /*maps_segments=*/false, tcp_link};

void serve_network() { net_set_handler(on_message, place); }

}  // namespace jaxcoll
