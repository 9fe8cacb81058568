// The network steps of a collective across GPU hosts (docs/cuda.md, "Across hosts"): FFI target `jaxcoll_network`
// on XLA's CUDA platform runs one collective over the ranks of each of its replica groups (a rail, one rank per
// host, for all_reduce, reduce_scatter and all_gather; the whole group for all_to_all, broadcast and ppermute,
// jaxcoll.algorithms.across_hosts) with XLA's own communicator, which newer XLA lends to FFI handlers through its
// collectives extension (xla/ffi/api/collectives_c_api.h): the handler asks for the clique of its groups in the
// prepare stage and gets the communicator (an ncclComm_t on XLA:GPU) at execution. jaxcoll writes no network stack of its own.
//
// Attributes: `collective` (a Collective code), `reduce_op`, `groups` (flattened device ids, `group_size` a group),
// `root` (broadcast's, a rank of the group) and `pairs` (ppermute's (source, target) ranks, interleaved; a rank no
// pair targets gets zeros); every one is checked, and a wrong one fails naming it.
//
// Whether the extension exists is decided when the module is compiled, from the FFI headers of the jaxlib it is
// built against (jaxlib 0.12.0.1 has it; 0.10.2 does not): without it the target is still registered, and
// both stages fail with a message saying which jaxlib is needed; `available()` says so before any program runs.
#pragma once

#include <string>

#include "xla/ffi/api/c_api.h"

namespace jaxcoll::xla_cuda::network {

// Whether this module was built with the collectives extension; `why` says what is missing when not.
bool available(std::string* why);

XLA_FFI_Error* prepare(XLA_FFI_CallFrame* frame);
XLA_FFI_Error* execute(XLA_FFI_CallFrame* frame);

}  // namespace jaxcoll::xla_cuda::network
