#include "csrc/transport.hpp"

#include "csrc/world.hpp"

namespace jaxcoll {

extern const Transport shared_memory_transport;  // csrc/transport/shm.cc
extern const Transport tcp_transport;            // csrc/transport/tcp.cc

namespace {

// Every transport, in order of preference: a pair of processes uses the first that reaches. A new transport is
// one line here (before those it should win over).
const Transport* const transports[] = {&shared_memory_transport, &tcp_transport};

}  // namespace

const Transport& transport_between(const World& world, int32_t a, int32_t b) {
  for (const Transport* t : transports)
    if (t->reaches(world, a, b)) return *t;
  return tcp_transport;  // reaches every process of the job: the table's last resort
}

}  // namespace jaxcoll
