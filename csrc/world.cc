#include "csrc/world.hpp"

#include <atomic>
#include <cerrno>
#include <memory>
#include <mutex>

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "csrc/net.hpp"
#include "csrc/shared_memory.hpp"

namespace jaxcoll {

namespace {

std::mutex mu;
std::atomic<const World*> current{nullptr};
// A pidfd per process on this host (-1 for others or where pidfd_open is unavailable): it polls readable once
// the process has exited, zombie or not, where kill(pid, 0) would still succeed until the parent reaps it.
std::vector<int> pidfds;

int open_pidfd(int64_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
#else
  (void)pid;
  return -1;
#endif
}

}  // namespace

std::string World::describe_host(int32_t p) const {
  std::string s = "host " + std::to_string(hosts[p]);
  if (size_t(p) < host_names.size() && !host_names[p].empty()) s += " ('" + host_names[p] + "')";
  return s;
}

Status configure_world(int32_t process, std::vector<int64_t> pids, std::vector<int32_t> hosts, std::string token,
                       std::vector<std::string> host_names) {
  std::lock_guard<std::mutex> lock(mu);
  if (pids.size() != hosts.size() || process < 0 || process >= static_cast<int32_t>(pids.size()))
    return Status::Error("jaxcoll: configure_world(process=" + std::to_string(process) + ") with " +
                         std::to_string(pids.size()) + " pids and " + std::to_string(hosts.size()) + " hosts");
  if (token.empty() || token.find_first_not_of("0123456789abcdef") != std::string::npos)
    return Status::Error("jaxcoll: configure_world: the job token must be lowercase hex, got '" + token + "'");
  if (const World* w = current.load()) {
    if (w->process == process && w->pids == pids && w->hosts == hosts && w->token == token) return {};
    return Status::Error("jaxcoll: the multi-process runtime is already set up for another job (process " +
                         std::to_string(w->process) + " of " + std::to_string(w->nprocesses()) +
                         "); it is set up once per process");
  }
  auto w = std::make_unique<World>();
  w->process = process;
  w->pids = std::move(pids);
  w->hosts = std::move(hosts);
  w->token = std::move(token);
  w->host_names = std::move(host_names);
  pidfds.assign(w->pids.size(), -1);
  for (int32_t p = 0; p < w->nprocesses(); ++p)
    if (p != process && w->same_host(p, process)) pidfds[p] = open_pidfd(w->pids[p]);
  clean_stale_segments();
  current.store(w.release());  // lives as long as the process
  return {};
}

const World* world() { return current.load(); }

bool process_alive(int32_t p) {
  const World* w = world();
  if (!w || p < 0 || p >= w->nprocesses() || p == w->process) return true;
  if (!w->same_host(p, w->process)) return net_alive(p);
  if (pidfds[p] >= 0) {
    pollfd fd{pidfds[p], POLLIN, 0};
    return poll(&fd, 1, 0) == 0;
  }
  return !(kill(static_cast<pid_t>(w->pids[p]), 0) != 0 && errno == ESRCH);
}

}  // namespace jaxcoll
