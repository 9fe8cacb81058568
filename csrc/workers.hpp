// Threads of jaxcoll's own for work that must not run on XLA's threads: a call of a group that spans processes
// waits for its peers for as long as they take, and a device thread (or one of XLA's few intra-op pool threads)
// held that long can be what another collective's local ranks are queued behind (two independent collectives
// that two processes run in opposite orders would deadlock). Each task gets an idle thread, or a new one: a task
// may block (a completion can resume an XLA program that waits in its own collectives), so the pool never makes a
// task wait for another.
#pragma once

#include <functional>

namespace jaxcoll {

void run_on_worker(std::function<void()> task);

}  // namespace jaxcoll
