#include "xla_ffi/cuda_handler.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <span>
#include <string>

#include "csrc/abi.hpp"
#include "csrc/cuda/device_group.hpp"
#include "csrc/executor.hpp"
#include "csrc/world.hpp"
#include "xla_ffi/call_attributes.hpp"
#include "xla_ffi/cuda_nvtx.hpp"
#include "xla_ffi/dtypes.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcoll::xla_cuda {
namespace {

using cuda::GroupMember;

std::string site_of(int64_t callsite, const char* stage) {
  return std::string("jaxcoll CUDA ") + stage + ", callsite " + std::to_string(callsite);
}

ffi::ErrorOr<cuda::CallShape> shape_of(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer>& out, int32_t reduce_op,
                                       int64_t callsite) {
  const auto dtype = dtype_of(x.element_type());
  if (!dtype)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        site_of(callsite, "call") + ": unsupported element type " + std::to_string(static_cast<int>(x.element_type())) +
        "; jaxcoll supports float16, bfloat16, float32, float64, int8, int32, int64, uint8, uint32 and bool"));
  if (out->element_type() != x.element_type())
    return ffi::Unexpected(ffi::Error::InvalidArgument(site_of(callsite, "call") +
                                                       ": the result's element type differs from the operand's"));
  const auto op = reduce_op_from_code(reduce_op);
  if (!op)
    return ffi::Unexpected(ffi::Error::InvalidArgument(site_of(callsite, "call") + ": reduce_op=" +
                                                       std::to_string(reduce_op) + " is not " + reduce_op_codes()));
  cuda::CallShape s;
  s.dtype = *dtype;
  s.op = *op;
  s.input_elements = static_cast<int64_t>(x.element_count());
  s.output_elements = static_cast<int64_t>(out->element_count());
  return s;
}

// A device's first call of a call site: its rank and group are computed on the device (lax.axis_index), so
// read them once here, where XLA allows a synchronisation, and join the group.
ffi::ErrorOr<GroupMember*> join(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> rank_buf,
                                ffi::Buffer<ffi::S32> group_buf, ffi::Result<ffi::AnyBuffer>& out,
                                ffi::Span<const int32_t> words, int32_t reduce_op, int64_t callsite,
                                ffi::Span<const int32_t> processes) {
  if (GroupMember* m = cuda::find_member(callsite, device)) return m;
  auto shape = shape_of(x, out, reduce_op, callsite);
  if (!shape.has_value()) return ffi::Unexpected(shape.error());
  int32_t ids[2] = {0, 0};
  cudaError_t err = cudaMemcpyAsync(&ids[0], rank_buf.typed_data(), sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(&ids[1], group_buf.typed_data(), sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess)
    return ffi::Unexpected(ffi::Error::Internal(site_of(callsite, "initialize") +
                                                ": reading the rank and group operands failed: " +
                                                cudaGetErrorString(err)));
  // The group's process map: empty when every rank is in this process; else the ranks of other processes of
  // this host are reached through CUDA IPC (device_group.hpp). A plan's steps never cross hosts: the lowering
  // gives a collective over GPUs of several hosts host-local plans and network steps (docs/cuda.md).
  std::span<const int32_t> group_processes;
  const int32_t nranks = words.size() > 3 ? words.begin()[3] : 0;
  if (processes.size() > 0 && nranks > 0) {
    if (ids[1] < 0 || processes.size() < size_t(ids[1] + 1) * size_t(nranks))
      return ffi::Unexpected(ffi::Error::InvalidArgument(
          site_of(callsite, "initialize") + ": the processes attribute has " + std::to_string(processes.size()) +
          " entries, too few for group " + std::to_string(ids[1]) + " of " + std::to_string(nranks) + " ranks"));
    const int32_t* procs = processes.begin() + size_t(ids[1]) * size_t(nranks);
    if (std::any_of(procs, procs + nranks, [&](int32_t p) { return p != procs[0]; })) {
      const World* w = world();
      for (int32_t r = 0; w && r < nranks; ++r)
        if (procs[r] < 0 || procs[r] >= w->nprocesses() || !w->same_host(procs[r], w->process))
          return ffi::Unexpected(ffi::Error::InvalidArgument(
              site_of(callsite, "initialize") + ": rank " + std::to_string(r) + " of group " +
              std::to_string(ids[1]) + " runs in process " + std::to_string(procs[r]) + " on another host; a plan "
              "on the CUDA executor reaches the GPUs of one host only (CUDA IPC). Across hosts a collective runs "
              "host-local plans and network steps over XLA's communicator (docs/cuda.md), which needs a jaxlib "
              "with the FFI collectives extension"));
      group_processes = std::span<const int32_t>(procs, size_t(nranks));
    }
  }
  GroupMember* member = nullptr;
  if (Status st = cuda::join_group(callsite, ids[1], ids[0], device,
                                   std::span<const int32_t>(words.begin(), words.size()), group_processes, *shape,
                                   default_timeout_s(), member);
      !st.ok())
    return ffi::Unexpected(ffi::Error::Internal(site_of(callsite, "initialize") + ": " + st.message()));
  return member;
}

ffi::Error Initialize(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> rank,
                      ffi::Buffer<ffi::S32> group, ffi::Result<ffi::AnyBuffer> out, ffi::Span<const int32_t> words,
                      int32_t reduce_op, int64_t callsite, ffi::Span<const int32_t> processes) {
  auto member = join(stream, device, x, rank, group, out, words, reduce_op, callsite, processes);
  return member.has_value() ? ffi::Error::Success() : member.error();
}

ffi::Error Execute(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> rank,
                   ffi::Buffer<ffi::S32> group, ffi::Result<ffi::AnyBuffer> out, ffi::Span<const int32_t> words,
                   int32_t reduce_op, int64_t callsite, ffi::Span<const int32_t> processes) {
  GroupMember* member = cuda::find_member(callsite, device);
  if (!member) {
    // Initialize normally ran; joining here needs a synchronisation, which a CUDA graph capture forbids.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capturing) == cudaSuccess && capturing != cudaStreamCaptureStatusNone)
      return ffi::Error::Internal(site_of(callsite, "execute") + ": the group was not set up before CUDA graph "
                                  "capture (XLA did not run the initialize stage)");
    auto joined = join(stream, device, x, rank, group, out, words, reduce_op, callsite, processes);
    if (!joined.has_value()) return joined.error();
    member = *joined;
  }
  if (std::string why = cuda::group_failure(*member->group); !why.empty())
    return ffi::Error::Internal(site_of(callsite, "execute") + ": an earlier call of this group failed and left "
                                "its peers in an unknown state; restart the process. The failure was: " + why);
  if (static_cast<int64_t>(x.element_count()) != member->shape.input_elements ||
      static_cast<int64_t>(out->element_count()) != member->shape.output_elements ||
      dtype_of(x.element_type()) != member->shape.dtype)
    return ffi::Error::InvalidArgument(site_of(callsite, "execute") + ": the operand's shape or type changed "
                                       "since the group was set up");
  const void* in = x.untyped_data();
  void* result = out->untyped_data();
  const NvtxRange range("execute", callsite, member->rank);
  if (Status st = member->launcher->enqueue(&in, &result, reinterpret_cast<cuda::Stream>(stream)); !st.ok())
    return ffi::Error::Internal(site_of(callsite, "execute") + ", rank " + std::to_string(member->rank) + ": " +
                                st.message());
  return ffi::Error::Success();
}

}  // namespace

namespace {
// Both stages see the whole call: stream, device, operands, result and attributes.
template <ffi::ExecutionStage stage>
auto call_binding() {
  return bind_call_attributes(ffi::Ffi::Bind<stage>()
                                  .template Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .template Ctx<ffi::DeviceOrdinal>()
                                  .template Arg<ffi::AnyBuffer>()
                                  .template Arg<ffi::Buffer<ffi::S32>>()
                                  .template Arg<ffi::Buffer<ffi::S32>>()
                                  .template Ret<ffi::AnyBuffer>());
}
}  // namespace

// On the compiling thread, not at initialize: setting the job up reads jax.distributed's key-value store, a Python
// object, and XLA's device threads reach it only by taking the GIL, which the thread that launched the program may
// hold (docs/cuda.md).
ffi::Error Instantiate(ffi::Span<const int32_t>, int32_t, int64_t callsite, ffi::Span<const int32_t> processes) {
  if (processes.size() == 0) return ffi::Error::Success();
  if (Status st = set_up_world(); !st.ok())
    return ffi::Error::Internal(site_of(callsite, "instantiate") + ": " + st.message());
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(kInstantiate, Instantiate, bind_call_attributes(ffi::Ffi::BindInstantiate()));
XLA_FFI_DEFINE_HANDLER(kInitialize, Initialize, call_binding<ffi::ExecutionStage::kInitialize>());
XLA_FFI_DEFINE_HANDLER(kExecute, Execute, call_binding<ffi::ExecutionStage::kExecute>(),
                       {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_Error* instantiate(XLA_FFI_CallFrame* frame) { return kInstantiate(frame); }
XLA_FFI_Error* initialize(XLA_FFI_CallFrame* frame) { return kInitialize(frame); }
XLA_FFI_Error* execute(XLA_FFI_CallFrame* frame) { return kExecute(frame); }

}  // namespace jaxcoll::xla_cuda
