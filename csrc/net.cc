#include "csrc/net.hpp"

#include <atomic>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "csrc/env.hpp"

namespace jaxcoll {

namespace {

constexpr uint64_t kHelloMagic = 0x4F4C4C4548584A43ull;  // "CJXHELLO"
constexpr size_t kTokenBytes = 32;
// A peer sends its hello the moment it connects; a connection silent this long is a stranger. Hellos are awaited
// side by side, so a stranger delays no peer: the deadline only bounds what strangers hold.
constexpr auto kHelloWithin = std::chrono::seconds(2);
constexpr size_t kMostAwaitingHello = 64;

struct Hello {
  uint64_t magic = kHelloMagic;
  int32_t process = 0;
  int32_t pad = 0;
  char token[kTokenBytes] = {};
};

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

bool send_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= size_t(n);
  }
  return true;
}

bool recv_all(int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= size_t(n);
  }
  return true;
}

// One connection to a peer process: its socket, its send queue and the two threads.
struct Link {
  int fd = -1;
  int32_t peer = -1;
  std::atomic<bool> alive{true};
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<NetMessage, std::vector<char>>> queue;
  uint64_t queued = 0, written = 0;  // messages queued and written to the socket so far (net_flush)
  std::condition_variable written_cv;
  // Payload buffers the sender has finished with, reused by the next sends: a fresh buffer per message would
  // fault in its pages again on every large answer.
  std::vector<std::vector<char>> spare;
};

constexpr size_t kSpareBuffers = 4;

}  // namespace

// A read whose answer is awaited (net_request, net_await).
struct NetRead {
  int32_t to = -1;
  uint64_t request = 0;
  void* dst = nullptr;
  size_t bytes = 0;
  bool sent = false;
  std::atomic<bool> done{false};
  bool ok = false;
  Doorbell bell;
};

namespace {

struct Net {
  std::mutex mu;
  std::condition_variable connected_cv;
  std::map<int32_t, std::shared_ptr<Link>> links;  // by peer process
  NetHandler handler;
  NetPlacer placer;
  std::string token;
  int32_t process = -1;
  int listen_fd = -1;
  std::atomic<int> refused{0};
  std::mutex pending_mu;
  std::map<uint64_t, std::shared_ptr<NetRead>> pending;
  std::atomic<uint64_t> next_request{1};
};

Net& net() {
  static Net* n = new Net();  // leaked on purpose: its threads outlive static destruction
  return *n;
}

// Reads `bytes` of payload into `dst`, or discards them when dst is nullptr.
bool recv_payload(int fd, void* dst, size_t bytes, std::vector<char>& scratch) {
  if (dst) return recv_all(fd, dst, bytes);
  scratch.resize(bytes);
  return recv_all(fd, scratch.data(), bytes);
}

void receive_loop(std::shared_ptr<Link> link) {
  Net& n = net();
  std::vector<char> payload;  // reused: its capacity grows to the largest message once
  for (;;) {
    NetMessage m;
    if (!recv_all(link->fd, &m, sizeof(m))) break;
    if (m.type == NetMessage::kData) {
      std::shared_ptr<NetRead> p;
      {
        std::lock_guard<std::mutex> lock(n.pending_mu);
        auto it = n.pending.find(m.request);
        if (it != n.pending.end()) p = it->second;
      }
      const bool fits = p && m.bytes == p->bytes;
      if (!recv_payload(link->fd, fits ? p->dst : nullptr, m.bytes, payload)) break;
      if (p) {
        p->ok = fits;
        p->done.store(true, std::memory_order_release);
        p->bell.ring();
      }
      continue;
    }
    NetHandler handler;
    NetPlacer placer;
    {
      std::lock_guard<std::mutex> lock(n.mu);
      handler = n.handler;
      placer = n.placer;
    }
    void* at = m.bytes && placer ? placer(m) : nullptr;
    if (!recv_payload(link->fd, at, m.bytes, payload)) break;
    if (at) payload.clear();
    if (handler) handler(m, payload, at != nullptr);
  }
  // Every read waiting on this connection gives up at its next wake (net_read asks net_alive), as does a flush.
  {
    std::lock_guard<std::mutex> lock(link->mu);
    link->alive.store(false, std::memory_order_release);
  }
  link->cv.notify_all();
  link->written_cv.notify_all();
}

void send_loop(std::shared_ptr<Link> link) {
  // A slow link on demand (JAXCOLL_NET_DELAY_US): every message waits this long in the sender, which is how the
  // tests widen the window between a message queued and a message on the wire.
  const auto delay = std::chrono::microseconds(env_settings().net_delay_us.value_or(0));
  std::unique_lock<std::mutex> lock(link->mu);
  for (;;) {
    link->cv.wait(lock, [&] { return !link->queue.empty() || !link->alive.load(); });
    if (!link->alive.load()) return;
    auto [m, payload] = std::move(link->queue.front());
    link->queue.pop_front();
    lock.unlock();
    if (delay.count()) std::this_thread::sleep_for(delay);
    const bool ok = send_all(link->fd, &m, sizeof(m)) && (payload.empty() || send_all(link->fd, payload.data(),
                                                                                       payload.size()));
    lock.lock();
    if (!payload.empty() && link->spare.size() < kSpareBuffers) link->spare.push_back(std::move(payload));
    if (!ok) {
      link->alive.store(false);
      ::shutdown(link->fd, SHUT_RDWR);
      link->written_cv.notify_all();
      return;
    }
    ++link->written;
    link->written_cv.notify_all();
  }
}

void start_link(int fd, int32_t peer) {
  Net& n = net();
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto link = std::make_shared<Link>();
  link->fd = fd;
  link->peer = peer;
  {
    std::lock_guard<std::mutex> lock(n.mu);
    n.links[peer] = link;
  }
  n.connected_cv.notify_all();
  std::thread([link] { receive_loop(link); }).detach();
  std::thread([link] { send_loop(link); }).detach();
}

// A connection accepted, whose hello has not all arrived yet.
struct AwaitingHello {
  int fd = -1;
  std::string from;  // address:port, for the log
  Clock::time_point deadline;
  Hello hello;
  size_t got = 0;  // bytes of the hello read so far
};

std::string peer_address(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  char text[INET_ADDRSTRLEN] = "?";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(a.sin_port));
}

// Close a connection that is no peer of the job: counted, and said on stderr (the job goes on).
void refuse(const AwaitingHello& c, const std::string& why) {
  Net& n = net();
  const int count = n.refused.fetch_add(1) + 1;
  ::close(c.fd);
  std::fprintf(stderr, "jaxcoll: process %d closed a connection from %s to its network port: %s (%d refused so "
               "far; the job goes on)\n", n.process, c.from.c_str(), why.c_str(), count);
}

// Read what has arrived of c's hello; true when c is settled (linked to its peer, or refused).
bool read_hello(AwaitingHello& c) {
  Net& n = net();
  const ssize_t got = ::recv(c.fd, reinterpret_cast<char*>(&c.hello) + c.got, sizeof(Hello) - c.got, MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  if (got <= 0) {
    refuse(c, "it closed before presenting the job's hello");
    return true;
  }
  c.got += size_t(got);
  if (c.got < sizeof(Hello)) return false;
  const Hello& h = c.hello;
  if (h.magic != kHelloMagic || std::string(h.token, strnlen(h.token, kTokenBytes)) != n.token)
    refuse(c, "it did not present the job's token");
  else if (h.process < 0 || h.process == n.process)
    refuse(c, "it presented the job's token as process " + std::to_string(h.process));
  else
    start_link(c.fd, h.process);
  return true;
}

// Accepts connections and awaits their hellos side by side (one poll over the port and every connection still
// silent): a peer's connection is linked as soon as its hello arrives, whatever strangers are connected.
void accept_loop(int fd) {
  std::vector<AwaitingHello> awaiting;
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign(1, pollfd{fd, POLLIN, 0});
    for (const AwaitingHello& c : awaiting) fds.push_back({c.fd, POLLIN, 0});
    int wait_ms = -1;
    for (const AwaitingHello& c : awaiting) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(c.deadline - Clock::now()).count();
      wait_ms = static_cast<int>(std::max<int64_t>(0, wait_ms < 0 ? left : std::min<int64_t>(wait_ms, left)));
    }
    if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) return;
    const auto now = Clock::now();
    std::vector<AwaitingHello> still;
    for (size_t i = 0; i < awaiting.size(); ++i) {
      AwaitingHello& c = awaiting[i];
      if (fds[i + 1].revents && read_hello(c)) continue;
      if (now >= c.deadline) {
        refuse(c, "it presented no hello within " + std::to_string(kHelloWithin.count()) + " s");
        continue;
      }
      still.push_back(std::move(c));
    }
    awaiting = std::move(still);
    if (!(fds[0].revents & POLLIN)) continue;
    const int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      return;
    }
    if (awaiting.size() >= kMostAwaitingHello) {
      refuse(awaiting.front(), "more connections than " + std::to_string(kMostAwaitingHello) +
                                   " awaited their hello at once");
      awaiting.erase(awaiting.begin());
    }
    awaiting.push_back({c, peer_address(c), now + kHelloWithin});
  }
}

}  // namespace

void net_set_handler(NetHandler handler, NetPlacer placer) {
  Net& n = net();
  std::lock_guard<std::mutex> lock(n.mu);
  n.handler = std::move(handler);
  n.placer = std::move(placer);
}

Status net_listen(int32_t process, const std::string& address, int port, const std::string& token, int& bound) {
  Net& n = net();
  std::lock_guard<std::mutex> lock(n.mu);
  // A peer may connect and send the moment the port is open; a message before the handler would be lost.
  if (!n.handler) return Status::Error("jaxcoll: internal: the network handler must be set before listening");
  if (n.listen_fd >= 0) {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    getsockname(n.listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
    bound = ntohs(a.sin_port);
    return {};
  }
  if (token.size() > kTokenBytes) return Status::Error("jaxcoll: the job token is longer than 32 characters");
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Error("jaxcoll: cannot open a socket for the network transport: " + errno_text(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (!address.empty() && inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    if (getaddrinfo(address.c_str(), nullptr, &hints, &res) != 0 || !res) {
      ::close(fd);
      return Status::Error("jaxcoll: cannot resolve the address '" + address + "' to listen on for the network "
                           "transport (JAXCOLL_NET_BIND, else the address published: JAXCOLL_NET_ADDRESS)");
    }
    a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 128) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Error("jaxcoll: cannot listen on port " + std::to_string(port) + " at " +
                         (address.empty() ? std::string("every address") : address) + " for the network transport: " +
                         errno_text(err) + (err == EADDRINUSE ? "; the port is taken: choose another with "
                                                                "JAXCOLL_NET_PORT, or leave it unset for a free one"
                                                              : ""));
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  bound = ntohs(a.sin_port);
  n.listen_fd = fd;
  n.token = token;
  n.process = process;
  std::thread([fd] { accept_loop(fd); }).detach();
  return {};
}

Status net_connect(const std::vector<int32_t>& peers, const std::vector<std::string>& addresses,
                   const std::vector<int>& ports, double timeout_s) {
  Net& n = net();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  for (int32_t p : peers) {
    if (p < n.process) continue;  // the lower index connects
    {
      std::lock_guard<std::mutex> lock(n.mu);
      if (n.links.count(p)) continue;
    }
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(addresses[p].c_str(), std::to_string(ports[p]).c_str(), &hints, &res) != 0 || !res)
      return Status::Error("jaxcoll: cannot resolve process " + std::to_string(p) + "'s address '" + addresses[p] +
                           "' for the network transport");
    int fd = -1;
    for (;;) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
      const int err = errno;
      if (fd >= 0) ::close(fd);
      fd = -1;
      if (Clock::now() >= deadline) {
        freeaddrinfo(res);
        return Status::Error("jaxcoll: cannot connect to process " + std::to_string(p) + " at " + addresses[p] + ":" +
                             std::to_string(ports[p]) + " within " + std::to_string(timeout_s) + " s: " +
                             errno_text(err));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    freeaddrinfo(res);
    Hello h;
    h.process = n.process;
    std::memcpy(h.token, n.token.data(), n.token.size());
    if (!send_all(fd, &h, sizeof(h))) {
      ::close(fd);
      return Status::Error("jaxcoll: the connection to process " + std::to_string(p) + " broke during the hello");
    }
    start_link(fd, p);
  }
  // The higher-indexed peers' connections to us.
  std::unique_lock<std::mutex> lock(n.mu);
  const bool all = n.connected_cv.wait_until(lock, deadline, [&] {
    for (int32_t p : peers)
      if (!n.links.count(p)) return false;
    return true;
  });
  if (!all) {
    std::string missing;
    for (int32_t p : peers)
      if (!n.links.count(p)) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    return Status::Error("jaxcoll: processes [" + missing + "] did not connect to process " +
                         std::to_string(n.process) + " within " + std::to_string(timeout_s) +
                         " s (network transport; timeout set by JAXCOLL_TIMEOUT)");
  }
  return {};
}

bool net_send(int32_t to, NetMessage m, const void* payload) {
  Net& n = net();
  std::shared_ptr<Link> link;
  {
    std::lock_guard<std::mutex> lock(n.mu);
    auto it = n.links.find(to);
    if (it == n.links.end()) return false;
    link = it->second;
  }
  if (!link->alive.load()) return false;
  m.from = n.process;
  std::vector<char> bytes;
  if (m.bytes) {
    {
      std::lock_guard<std::mutex> lock(link->mu);
      for (auto it = link->spare.begin(); it != link->spare.end(); ++it)
        if (it->capacity() >= m.bytes) {
          bytes = std::move(*it);
          link->spare.erase(it);
          break;
        }
    }
    bytes.resize(m.bytes);
    std::memcpy(bytes.data(), payload, m.bytes);
  }
  {
    std::lock_guard<std::mutex> lock(link->mu);
    link->queue.emplace_back(m, std::move(bytes));
    ++link->queued;
  }
  link->cv.notify_one();
  return true;
}

bool net_flush(int32_t to, Clock::time_point deadline) {
  std::shared_ptr<Link> link;
  {
    Net& n = net();
    std::lock_guard<std::mutex> lock(n.mu);
    auto it = n.links.find(to);
    if (it == n.links.end()) return true;
    link = it->second;
  }
  std::unique_lock<std::mutex> lock(link->mu);
  const uint64_t target = link->queued;
  link->written_cv.wait_until(lock, deadline, [&] { return link->written >= target || !link->alive.load(); });
  return link->written >= target;
}

std::shared_ptr<NetRead> net_request(int32_t to, NetMessage get, void* dst, size_t bytes) {
  Net& n = net();
  auto p = std::make_shared<NetRead>();
  p->to = to;
  p->dst = dst;
  p->bytes = bytes;
  get.type = NetMessage::kGet;
  get.request = p->request = n.next_request.fetch_add(1);
  get.bytes = 0;
  {
    std::lock_guard<std::mutex> lock(n.pending_mu);
    n.pending[get.request] = p;
  }
  p->sent = net_send(to, get, nullptr);
  return p;
}

Status net_await(NetRead& p, Clock::time_point deadline) {
  Net& n = net();
  const int32_t to = p.to;
  Status st;
  if (!p.sent) {
    st = Status::Error("the connection to process " + std::to_string(to) + " is gone");
  } else {
    const WaitResult w = wait_for(p.bell, [&] { return p.done.load(std::memory_order_acquire); },
                                  [&] { return !net_alive(to); }, deadline);
    if (w == WaitResult::kAborted)
      st = Status::Error("the connection to process " + std::to_string(to) + " broke during a read");
    else if (w == WaitResult::kTimeout)
      st = Status::Error("process " + std::to_string(to) + " did not answer a read in time");
    else if (!p.ok)
      st = Status::Error("process " + std::to_string(to) + " answered a read of " + std::to_string(p.bytes) +
                         " bytes with another size");
  }
  std::lock_guard<std::mutex> lock(n.pending_mu);
  n.pending.erase(p.request);
  return st;
}

bool net_alive(int32_t p) {
  Net& n = net();
  std::lock_guard<std::mutex> lock(n.mu);
  auto it = n.links.find(p);
  return it == n.links.end() || it->second->alive.load();
}

int net_refused() { return net().refused.load(); }

}  // namespace jaxcoll
