#include "xla_ffi/cuda_network.hpp"

#include <cuda_runtime_api.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "csrc/abi.hpp"
#include "csrc/cuda/nccl.hpp"
#include "xla/ffi/api/ffi.h"
#include "xla_ffi/dtypes.hpp"

// The collectives extension appeared in the FFI headers after jaxlib 0.10.2; only its C API is used (its C++
// wrapper, collectives_api.h, has changed between releases: 0.12.0.1 added collective memory windows).
#if __has_include("xla/ffi/api/collectives_c_api.h")
#define JAXCOLL_FFI_COLLECTIVES 1
#include "xla/ffi/api/collectives_c_api.h"
#endif

namespace ffi = xla::ffi;

namespace jaxcoll::xla_cuda::network {
namespace {

constexpr const char* kNeeds =
    "jaxcoll's network steps across GPU hosts run on XLA's own communicator, which XLA lends to FFI handlers "
    "through its collectives extension (xla/ffi/api/collectives_c_api.h: jaxlib 0.11.2 and later)";

#ifdef JAXCOLL_FFI_COLLECTIVES
// The extension as the handler sees it: null where XLA did not attach it to this call (a runtime without it).
struct Collectives {
  const XLA_FFI_Api* api = nullptr;
  const XLA_FFI_Collectives_Extension* ext = nullptr;
  std::string why;  // why `ext` is null
};
#endif

}  // namespace
}  // namespace jaxcoll::xla_cuda::network

#ifdef JAXCOLL_FFI_COLLECTIVES
namespace xla::ffi {
// Decoded by hand from the C API (XLA_FFI_InvokeContext_FindExtension), never failing: an absent extension becomes
// the handler's own error, which names what to install, instead of the FFI's generic decoding failure.
template <>
struct CtxDecoding<jaxcoll::xla_cuda::network::Collectives> {
  using Type = jaxcoll::xla_cuda::network::Collectives;
  static std::optional<Type> Decode(const XLA_FFI_Api* api, XLA_FFI_InvokeContext* ctx, DiagnosticEngine&) {
    Type out;
    out.api = api;
    XLA_FFI_InvokeContext_FindExtension_Args args;
    args.struct_size = XLA_FFI_InvokeContext_FindExtension_Args_STRUCT_SIZE;
    args.extension_start = nullptr;
    args.ctx = ctx;
    args.extension_type = XLA_FFI_Extension_Collectives;
    args.extension = nullptr;
    if (XLA_FFI_Error* err = api->XLA_FFI_InvokeContext_FindExtension(&args)) {
      out.why = std::string("XLA did not attach its collectives extension to this call: ") + internal::GetErrorMessage(api, err);
      internal::DestroyError(api, err);
      return out;
    }
    if (!args.extension) {
      out.why = "XLA did not attach its collectives extension to this call (this XLA runtime does not lend its "
                "communicators to FFI handlers)";
      return out;
    }
    // Minor versions only add callbacks after the ones used here (0.2 added collective memory windows).
    if (args.extension->id.major_version != XLA_FFI_Extension_Collectives_MajorVersion ||
        args.extension->id.minor_version < 1) {
      out.why = "XLA's collectives extension has version " + std::to_string(args.extension->id.major_version) + "." +
                std::to_string(args.extension->id.minor_version) + "; jaxcoll was built for " +
                std::to_string(XLA_FFI_Extension_Collectives_MajorVersion) + ".x";
      return out;
    }
    out.ext = reinterpret_cast<const XLA_FFI_Collectives_Extension*>(args.extension);
    return out;
  }
};
}  // namespace xla::ffi
#endif

namespace jaxcoll::xla_cuda::network {
namespace {

std::string site(const char* stage) { return std::string("jaxcoll network step (") + stage + ")"; }

#ifdef JAXCOLL_FFI_COLLECTIVES
// The replica groups as the C API takes them: `ids` holds groups of `size` flattened device ids each.
std::vector<XLA_FFI_ReplicaGroup> replica_groups(ffi::Span<const int64_t> ids, int64_t size) {
  std::vector<XLA_FFI_ReplicaGroup> groups;
  for (size_t at = 0; size > 0 && at + size_t(size) <= ids.size(); at += size_t(size))
    groups.push_back(XLA_FFI_ReplicaGroup{ids.begin() + at, size_t(size)});
  return groups;
}

ffi::Error take_error(const Collectives& c, XLA_FFI_Error* err, const std::string& what) {
  std::string message = ffi::internal::GetErrorMessage(c.api, err);
  ffi::internal::DestroyError(c.api, err);
  return ffi::Error::Internal(what + ": " + message);
}

// "all_reduce, ..., broadcast or ppermute": the collectives with a meaning of their own (csrc/collectives.hpp),
// which the network steps run; a custom plan's steps have no NCCL counterpart.
std::string network_collectives() {
  std::string names;
  int32_t count = 0, listed = 0;
  for (const CollectiveInfo& c : kCollectives) count += !c.plan_states;
  for (const CollectiveInfo& c : kCollectives) {
    if (c.plan_states) continue;
    if (listed++) names += listed == count ? " or " : ", ";
    names += c.name;
  }
  return names;
}

ffi::Error check_groups(ffi::Span<const int64_t> ids, int64_t size, const char* stage) {
  if (size < 1 || ids.size() == 0 || ids.size() % size_t(size) != 0)
    return ffi::Error::InvalidArgument(site(stage) + ": " + std::to_string(ids.size()) + " device ids do not form "
                                       "groups of group_size=" + std::to_string(size));
  return ffi::Error::Success();
}

// The prepare stage reads the groups only, but binds every attribute of the call (see kPrepare).
ffi::Error Prepare(Collectives c, int32_t /*collective*/, int32_t /*reduce_op*/, ffi::Span<const int64_t> groups,
                   int64_t group_size, int32_t /*root*/, ffi::Span<const int64_t> /*pairs*/) {
  if (!c.ext) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, site("prepare") + ": " + c.why + ". " + kNeeds);
  if (ffi::Error e = check_groups(groups, group_size, "prepare"); e.failure()) return e;
  std::vector<XLA_FFI_ReplicaGroup> raw = replica_groups(groups, group_size);
  XLA_FFI_Communicator_Request_Args args;
  args.struct_size = XLA_FFI_Communicator_Request_Args_STRUCT_SIZE;
  args.extension_start = nullptr;
  args.group_mode = XLA_FFI_GROUP_FLATTENED_ID;  // ids are the devices' positions in the program's assignment
  args.groups = raw.data();
  args.num_groups = raw.size();
  args.communication_id = 0;
  if (XLA_FFI_Error* err = c.ext->request_communicator(c.ext, &args))
    return take_error(c, err, site("prepare") + ": requesting XLA's communicator for the network groups");
  return ffi::Error::Success();
}

// `root` (broadcast) and `pairs` (ppermute: source and target ranks interleaved) name ranks of a group of
// `group_size`; both are checked whatever the collective, so a malformed call fails the same way for every one.
ffi::Error check_root_and_pairs(int32_t root, ffi::Span<const int64_t> pairs, int64_t group_size) {
  const std::string n = std::to_string(group_size);
  if (root < 0 || root >= group_size)
    return ffi::Error::InvalidArgument(site("execute") + ": root=" + std::to_string(root) +
                                       " is not a rank of a group of group_size=" + n);
  if (pairs.size() % 2)
    return ffi::Error::InvalidArgument(site("execute") + ": pairs holds " + std::to_string(pairs.size()) +
                                       " values, not (source, target) pairs");
  std::vector<bool> sends(static_cast<size_t>(group_size), false), receives(sends);
  for (size_t i = 0; i < pairs.size(); i += 2) {
    const int64_t source = pairs[i], target = pairs[i + 1];
    const std::string pair = "(" + std::to_string(source) + ", " + std::to_string(target) + ")";
    if (source < 0 || source >= group_size || target < 0 || target >= group_size)
      return ffi::Error::InvalidArgument(site("execute") + ": pairs holds " + pair + ", outside a group of "
                                         "group_size=" + n);
    if (sends[source] || receives[target])
      return ffi::Error::InvalidArgument(site("execute") + ": pairs holds " + pair + ", whose " +
                                         (sends[source] ? "source" : "target") + " repeats");
    sends[source] = receives[target] = true;
  }
  return ffi::Error::Success();
}

ffi::Error Execute(cudaStream_t stream, Collectives c, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                   int32_t collective, int32_t reduce_op, ffi::Span<const int64_t> groups, int64_t group_size,
                   int32_t root, ffi::Span<const int64_t> pairs) {
  if (!c.ext) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, site("execute") + ": " + c.why + ". " + kNeeds);
  if (ffi::Error e = check_groups(groups, group_size, "execute"); e.failure()) return e;
  if (ffi::Error e = check_root_and_pairs(root, pairs, group_size); e.failure()) return e;
  const std::optional<Collective> code = collective_from_code(collective);
  if (!code || collective_info(*code).plan_states)
    return ffi::Error::InvalidArgument(site("execute") + ": collective=" + std::to_string(collective) +
                                       " is not the code of " + network_collectives());
  const Collective what = *code;
  const CollectiveInfo& info = collective_info(what);
  const auto dtype = dtype_of(x.element_type());
  const auto op = reduce_op_from_code(reduce_op);
  if (out->element_type() != x.element_type())
    return ffi::Error::InvalidArgument(site("execute") + ": the result's element type differs from the operand's");
  if (!op)
    return ffi::Error::InvalidArgument(site("execute") + ": reduce_op=" + std::to_string(reduce_op) + " is not " +
                                       reduce_op_codes());
  // NCCL's typed collectives (all_reduce, reduce_scatter, all_gather) need the element type; the others move bytes.
  if (!dtype && (info.reduces || what == Collective::kAllGather))
    return ffi::Error::InvalidArgument(site("execute") + ": unsupported element type for " + info.name);
  const size_t in = x.element_count(), result = out->element_count(), n = size_t(group_size);
  const size_t in_blocks = size_t(info.in_blocks(int32_t(n))), out_blocks = size_t(info.out_blocks(int32_t(n)));
  const bool sizes_ok = in % in_blocks == 0 && result == in / in_blocks * out_blocks;
  if (!sizes_ok)
    return ffi::Error::InvalidArgument(site("execute") + ": operand of " + std::to_string(in) + " and result of " +
                                       std::to_string(result) + " elements do not fit a " + info.name +
                                       " over " + std::to_string(n) + " ranks");
  std::vector<XLA_FFI_ReplicaGroup> raw = replica_groups(groups, group_size);
  XLA_FFI_Communicator_Get_Args args;
  args.struct_size = XLA_FFI_Communicator_Get_Args_STRUCT_SIZE;
  args.extension_start = nullptr;
  args.group_mode = XLA_FFI_GROUP_FLATTENED_ID;
  args.groups = raw.data();
  args.num_groups = raw.size();
  args.communication_id = 0;
  args.communicator = nullptr;
  if (XLA_FFI_Error* err = c.ext->get_communicator(c.ext, &args))
    return take_error(c, err, site("execute") + ": getting XLA's communicator for the network groups");
  void* comm = reinterpret_cast<void*>(args.communicator);
  auto* cu_stream = reinterpret_cast<CUstream_st*>(stream);
  const size_t bytes = x.size_bytes();
  // The communicator's ranks are the group's (XLA orders a clique as the replica group lists it): a communicator
  // of another size means that does not hold, and every collective below would pair the wrong ranks.
  int rank = -1, size = 0;
  Status st = cuda::nccl_rank(comm, &rank, &size);
  if (st.ok() && size != group_size)
    st = Status::Error("XLA's communicator for these groups has " + std::to_string(size) + " ranks, not group_size=" +
                       std::to_string(group_size));
  if (!st.ok()) return ffi::Error::Internal(site("execute") + ": " + st.message());
  switch (what) {
    case Collective::kAllReduce:
      st = cuda::nccl_collective(cuda::NetworkCollective::kAllReduce, x.untyped_data(), out->untyped_data(), in,
                                 *dtype, *op, comm, cu_stream);
      break;
    case Collective::kReduceScatter:
      st = cuda::nccl_collective(cuda::NetworkCollective::kReduceScatter, x.untyped_data(), out->untyped_data(),
                                 result, *dtype, *op, comm, cu_stream);
      break;
    case Collective::kAllGather:
      st = cuda::nccl_collective(cuda::NetworkCollective::kAllGather, x.untyped_data(), out->untyped_data(), in,
                                 *dtype, *op, comm, cu_stream);
      break;
    case Collective::kAllToAll:
      st = cuda::nccl_all_to_all(x.untyped_data(), out->untyped_data(), bytes / n, int(n), comm, cu_stream);
      break;
    case Collective::kBroadcast:
      st = cuda::nccl_broadcast(x.untyped_data(), out->untyped_data(), bytes, root, comm, cu_stream);
      break;
    default:  // custom is refused above; a collective added to the table without a case here is refused too
      st = Status::Error(std::string("the network steps have no NCCL call for ") + info.name);
      break;
    case Collective::kPpermute: {  // this rank's send and receive among the pairs
      int to = -1, from = -1;
      for (size_t i = 0; i < pairs.size(); i += 2) {
        if (pairs[i] == rank) to = int(pairs[i + 1]);
        if (pairs[i + 1] == rank) from = int(pairs[i]);
      }
      // lax.ppermute's contract: a rank that no pair targets gets zeros.
      if (from < 0 && bytes > 0)
        if (cudaError_t e = cudaMemsetAsync(out->untyped_data(), 0, bytes, stream); e != cudaSuccess) {
          st = Status::Error(std::string("cudaMemsetAsync of the zeros of a rank no pair targets: ") +
                             cudaGetErrorString(e));
          break;
        }
      st = cuda::nccl_send_recv(x.untyped_data(), to, out->untyped_data(), from, bytes, comm, cu_stream);
      break;
    }
  }
  if (!st.ok()) return ffi::Error::Internal(site("execute") + ": " + st.message());
  return ffi::Error::Success();
}

#else  // no collectives extension in the FFI headers this module was built against

ffi::Error Unavailable() {
  return ffi::Error(ffi::ErrorCode::kFailedPrecondition, std::string("jaxcoll network step: this jaxcoll was built against the FFI "
                                                    "headers of jaxlib ") + JAXCOLL_JAXLIB_VERSION +
                                        ", which have no collectives extension. " + kNeeds +
                                        ": rebuild jaxcoll against such a jaxlib");
}
ffi::Error Refuse(ffi::RemainingArgs, ffi::RemainingRets, ffi::Dictionary) { return Unavailable(); }

#endif

}  // namespace

#ifdef JAXCOLL_FFI_COLLECTIVES
namespace {
// The call's attributes (jaxcoll/lowering/across_hosts.py, _network_call), bound alike in both stages: XLA's FFI
// refuses a call frame whose number of attributes differs from the binding's ("Wrong number of attributes"), even
// in a stage that reads only some of them.
template <typename Binding>
auto network_attributes(Binding binding) {
  return std::move(binding)
      .template Attr<int32_t>("collective")
      .template Attr<int32_t>("reduce_op")
      .template Attr<ffi::Span<const int64_t>>("groups")
      .template Attr<int64_t>("group_size")
      .template Attr<int32_t>("root")
      .template Attr<ffi::Span<const int64_t>>("pairs");
}
}  // namespace

XLA_FFI_DEFINE_HANDLER(kPrepare, Prepare,
                       network_attributes(ffi::Ffi::Bind<ffi::ExecutionStage::kPrepare>().Ctx<Collectives>()));
XLA_FFI_DEFINE_HANDLER(kExecute, Execute,
                       network_attributes(ffi::Ffi::Bind()
                                              .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                              .Ctx<Collectives>()
                                              .Arg<ffi::AnyBuffer>()
                                              .Ret<ffi::AnyBuffer>()));
bool available(std::string*) { return true; }
#else
XLA_FFI_DEFINE_HANDLER(kPrepare, Refuse,
                       ffi::Ffi::Bind<ffi::ExecutionStage::kPrepare>().RemainingArgs().RemainingRets().Attrs());
XLA_FFI_DEFINE_HANDLER(kExecute, Refuse, ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs());
bool available(std::string* why) {
  if (why)
    *why = std::string("built against the FFI headers of jaxlib ") + JAXCOLL_JAXLIB_VERSION +
           ", which have no collectives extension. " + kNeeds;
  return false;
}
#endif

XLA_FFI_Error* prepare(XLA_FFI_CallFrame* frame) { return kPrepare(frame); }
XLA_FFI_Error* execute(XLA_FFI_CallFrame* frame) { return kExecute(frame); }

}  // namespace jaxcoll::xla_cuda::network
