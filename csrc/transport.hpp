// Peer transports of a cross-process group (cross_process.hpp): how this process reaches the ranks that one peer
// process hosts, for one call site and for each of its calls. The call itself (slots, matching calls across
// processes, staging, the lanes, the wait for every process) is the same whatever the transport; what differs
// per peer is written once here, and each transport is one file of csrc/transport/ and one line of the table in
// transport.cc (after NCCL's src/include/transport.h and src/transport/).
//
// A transport provides, for a peer process:
//   - whether it reaches that process at all (`reaches`; the first transport of the table that does is chosen);
//   - liveness (has the process exited?) and flushing (what this process said is out of its hands);
//   - per call: finding the peer's side of the call (and refusing another plan or shape), the peer's ranks as the
//     lanes address them (a PeerView: mapped memory, or a RemoteRanks whose reads, writes and signals travel),
//     telling the peer what this process did with the call, and asking what the peer did with it.
// Adding one (RDMA, CUDA IPC of host-pinned memory): a file in csrc/transport/ defining a Transport, its line in
// transport.cc, and the file in CMakeLists.txt (docs/multiprocess.md, "Transports").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "csrc/lanes.hpp"
#include "csrc/status.hpp"
#include "csrc/wait.hpp"

namespace jaxcoll {

struct World;
class CrossProcessCommunicator;
class CrossProcessCall;

// One call as seen through one peer process's transport. Created when the call opens; its methods run on the
// call's worker (find under the communicator's lock) and, for wake, tell and failure, on whichever thread fails
// the call.
class PeerCall {
 public:
  virtual ~PeerCall() = default;
  // Look for the peer's side of the call: `found` once the peer has published it. An error when the peer runs
  // another plan or shape at this call site.
  virtual Status find(bool& found) = 0;
  // Once found: address the peer's ranks, views[r] for each rank r the peer hosts, for the call's lanes.
  virtual void address(std::vector<PeerView>& views) = 0;
  // Wake the peer's worker where it waits for this process (publishing, finishing or failing the call).
  virtual void wake() = 0;
  // Tell the peer that this process published the call, finished its steps, or failed it (with `why`).
  enum class Event { kPublished, kDone, kFailed };
  virtual void tell(Event event, const std::string& why) = 0;
  // What the peer said of the call: why it failed it ("" while it has not), whether it has finished its steps.
  virtual std::string failure() = 0;
  virtual bool done() = 0;
  // The call is over in this process (`ok`: it succeeded): let go of what it held of the peer.
  virtual void finish(bool ok) = 0;
};

// One peer process of one call site, reached by one transport.
class PeerLink {
 public:
  virtual ~PeerLink() = default;
  // Peer `peer` (its index among the communicator's peers) of `call`.
  virtual std::unique_ptr<PeerCall> join(CrossProcessCall& call, size_t peer) = 0;
  // Whether the peer process still runs.
  virtual bool alive() const = 0;
  // Whether everything this process told the peer so far is out of its hands, by `deadline` (it may exit next);
  // true too when the peer can no longer hear it.
  virtual bool flush(Clock::time_point deadline) = 0;
};

// A transport: one entry of the table in transport.cc.
struct Transport {
  const char* name;
  // Whether it reaches process b from process a. Every process asks it of every pair, with the same answer, so
  // each computes where every other keeps the chunks its peers reach.
  bool (*reaches)(const World& world, int32_t a, int32_t b);
  // Whether a peer it reaches maps this process's call segments (a rank's chunks that such a peer reads or writes
  // are kept there, and the peer acknowledges each call slot it used); false: the peer's reads and writes are
  // served by this process from wherever its own steps keep the chunk.
  bool maps_segments;
  // The link to peer `peer` of `comm` (its index among comm's peers).
  std::unique_ptr<PeerLink> (*link)(CrossProcessCommunicator& comm, size_t peer);
};

// The transport between processes a and b (a != b): the first of the table that reaches.
const Transport& transport_between(const World& world, int32_t a, int32_t b);

}  // namespace jaxcoll
