// The job this process belongs to, when jaxcoll spans processes: which process this is, every process's pid and
// host, and the job's random token (names of shared-memory segments). jaxcoll.distributed fills it in once,
// through jax.distributed's key-value store: through the set-up step it registers, which the runtime runs when it
// instantiates the first compiled call whose group spans processes, or by an explicit jaxcoll.distributed.connect()
// (docs/multiprocess.md). A process that never calls configure_world runs every group in-process, as before.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "csrc/status.hpp"

namespace jaxcoll {

struct World {
  int32_t process = 0;             // this process's index (jax.process_index())
  std::vector<int64_t> pids;       // per process
  std::vector<int32_t> hosts;      // per process: equal values share a host (and /dev/shm)
  std::string token;               // the job's random token, hex
  std::vector<std::string> host_names;  // per process: its host's name for messages (may be empty)
  int32_t nprocesses() const { return static_cast<int32_t>(pids.size()); }
  bool same_host(int32_t a, int32_t b) const { return hosts[a] == hosts[b]; }
  // The prefix of process p's shared-memory segments (shared_memory.hpp).
  std::string segment_prefix(int32_t p) const;
  // "host 1 ('name')": process p's host, for messages.
  std::string describe_host(int32_t p) const;
};

// Set the job once; a second call must describe the same job.
Status configure_world(int32_t process, std::vector<int64_t> pids, std::vector<int32_t> hosts, std::string token,
                       std::vector<std::string> host_names = {});
// The job, or null before configure_world.
const World* world();

// The step that sets the job up (configure_world and the network transport's connections): registered by a
// process that is part of a job of several processes, run by set_up_world.
void set_world_set_up(std::function<Status()> set_up);
// Run the registered set-up step once, unless the job is set up already: what a call whose group spans processes
// does before it needs world(). OK, leaving world() null, when no step is registered (no job).
Status set_up_world();

// Whether process `p` of the job still runs: on this host, false once it has exited (or been killed), even
// before its parent reaps it, in any pid namespace (its presence's lock, shared_memory.hpp); on another host,
// false once its connection broke (net.hpp).
bool process_alive(int32_t p);

}  // namespace jaxcoll
