// The network transport between processes on different hosts (or forced between processes of one host with
// JAXCOLL_TRANSPORT=tcp): one TCP connection per pair of processes, opened once when the job is set up. A process
// listens on a port of its choosing (published through jax.distributed's key-value store), and the lower-indexed
// process of each pair connects to the higher; the first message on a connection presents the job's token, and a
// connection without it is closed.
//
// Each connection has a receiver thread, which hands every message to the handler (transport/tcp.cc) and never sends,
// and a sender thread that drains the connection's queue: a handler that answers a read queues its answer, so two
// processes answering each other's reads can never both block in send (the classic deadlock of a thread that both
// reads and writes a socket). Messages on one connection arrive in the order they were queued: data put before a
// signal is in place when the signal is seen, as with shared memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "csrc/status.hpp"
#include "csrc/wait.hpp"

namespace jaxcoll {

struct NetMessage {
  enum Type : uint32_t { kPublish = 1, kSignal, kPut, kGet, kData, kDone, kFailed };
  uint32_t type = 0;
  int32_t from = 0;  // the sending process
  int64_t callsite = 0;
  int32_t group = 0;
  int32_t rank = 0;  // signal, put, get: the receiver's rank addressed
  int64_t run_id = 0;
  uint64_t iteration = 0;
  int32_t buffer = 0;  // put, get: the chunk ref on the receiver's rank
  int32_t index = 0;
  int32_t count = 0;
  int32_t sem = 0;    // signal
  int32_t dtype = 0;  // publish
  int32_t pad = 0;
  int64_t block = 0;         // publish
  int64_t elements = 0;      // publish: input elements of each rank at the call site
  uint64_t fingerprint = 0;  // publish
  uint64_t request = 0;      // get, data: matches an answer to its read
  uint64_t bytes = 0;        // payload bytes that follow the header
};

// Where the payload of a message goes, asked on the receiver thread before it is read: the receiver reads it
// straight there (a put lands in its chunk without a copy), or into a buffer handed to the handler when this
// returns nullptr. Answers to reads (kData) always land in the reader's destination.
using NetPlacer = std::function<void*(const NetMessage& m)>;
// Called on a receiver thread for every message but kData (which net_read consumes); `payload` holds m.bytes bytes,
// or nothing when `placed` (the placer took them).
using NetHandler = std::function<void(const NetMessage& m, std::vector<char>& payload, bool placed)>;
void net_set_handler(NetHandler handler, NetPlacer placer);

// Listen at `address` ("" or "0.0.0.0": every interface), on `port` (0: a free one), for the job's peers
// presenting `token`; `bound` is the port taken. An error names the port when it is taken. The handler must be
// set first (net_set_handler). Connections are accepted side by side: one that presents no hello within 2 s, or
// another job's token, is closed, counted (net_refused) and logged on stderr, and delays no peer.
Status net_listen(int32_t process, const std::string& address, int port, const std::string& token, int& bound);

// Connect this process to every process in `peers` (their addresses and ports), each pair once, and wait until
// every connection is up and authenticated, or until `timeout_s`, naming the processes that never connected.
Status net_connect(const std::vector<int32_t>& peers, const std::vector<std::string>& addresses,
                   const std::vector<int>& ports, double timeout_s);

// Queue a message (and `m.bytes` bytes of payload) to process `to`; false if its connection is gone.
bool net_send(int32_t to, NetMessage m, const void* payload);

// Wait until every message queued to process `to` so far is written to its socket: then it is the kernel's to
// deliver, even if this process exits next, where a message still in the sender's queue dies with the process.
// True once written; false when the connection broke first (nothing queued to it can matter any more) or
// `deadline` passed.
bool net_flush(int32_t to, Clock::time_point deadline);

// A read in flight: net_request sends a kGet to process `to` and returns at once; its answer, `bytes` bytes,
// lands in `dst` on the receiver thread. net_await waits for it: an error when the connection breaks or
// `deadline` passes. Several reads may be in flight at once (to one process or many), so a lane that reads from
// several peers pays one round trip, not one per read.
struct NetRead;
std::shared_ptr<NetRead> net_request(int32_t to, NetMessage get, void* dst, size_t bytes);
Status net_await(NetRead& read, Clock::time_point deadline);
inline Status net_read(int32_t to, NetMessage get, void* dst, size_t bytes, Clock::time_point deadline) {
  return net_await(*net_request(to, get, dst, bytes), deadline);
}

// Whether process `p` is connected (false once its connection broke; true for a process never connected to).
bool net_alive(int32_t p);
// How many connections were refused: no hello in time, or another job's token (tests).
int net_refused();

}  // namespace jaxcoll
