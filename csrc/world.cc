#include "csrc/world.hpp"

#include <atomic>
#include <cerrno>
#include <memory>
#include <mutex>

#include <unistd.h>

#include "csrc/net.hpp"
#include "csrc/shared_memory.hpp"

namespace jaxcoll {

namespace {

std::mutex mu;
std::atomic<const World*> current{nullptr};
// The presence of each process on this host (-1 for others): its lock goes when the process exits, zombie or
// not, and means the same in every pid namespace (a pidfd or kill(pid, 0) would ask about another process there).
std::vector<int> presences;

// Apart from `mu`: the set-up step calls configure_world, and it may wait on the job's other processes.
std::mutex set_up_mu;
std::function<Status()> set_up_step;

}  // namespace

std::string World::segment_prefix(int32_t p) const { return jaxcoll::segment_prefix(token, p); }

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
  presences.assign(w->pids.size(), -1);
  for (int32_t p = 0; p < w->nprocesses(); ++p)
    if (p != process && w->same_host(p, process)) presences[p] = open_presence_fd(w->token, p);
  clean_stale_segments();
  current.store(w.release());  // lives as long as the process
  return {};
}

const World* world() { return current.load(); }

void set_world_set_up(std::function<Status()> set_up) {
  std::lock_guard<std::mutex> lock(set_up_mu);
  set_up_step = std::move(set_up);
}

Status set_up_world() {
  if (world()) return {};
  std::lock_guard<std::mutex> lock(set_up_mu);  // one thread sets up; the others wait for it, then find the world
  if (world() || !set_up_step) return {};
  return set_up_step();
}

bool process_alive(int32_t p) {
  const World* w = world();
  if (!w || p < 0 || p >= w->nprocesses() || p == w->process) return true;
  if (!w->same_host(p, w->process)) return net_alive(p);
  // A peer of this host whose presence is gone (unlinked by a cleaner, which it never is while it lives) has gone.
  return presences[p] >= 0 && presence_alive(presences[p]);
}

}  // namespace jaxcoll
