#include "xla_ffi/handler.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "csrc/abi.hpp"
#include "csrc/call_stats.hpp"
#include "csrc/communicator.hpp"
#include "csrc/executor.hpp"
#include "csrc/plan.hpp"
#include "csrc/cross_process.hpp"
#include "csrc/world.hpp"
#include "xla_ffi/call_attributes.hpp"
#include "xla_ffi/dtypes.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcoll::xla_cpu {
namespace {

// The communicators of one compiled call's groups, owned here: XLA destroys the state with the executable, and
// each call site's memory goes with it (in one process its rendezvous, scratch and staging: communicator.hpp;
// across processes its shared segments: cross_process.hpp). The first groups are found without a lock once made.
template <typename Comm>
class GroupCommunicators {
 public:
  // The communicator of `group`, made by `make(st)` on its first call; nullptr (with `st` set) if that failed.
  template <typename Make>
  Comm* get(int32_t group, Make&& make, Status& st) {
    const bool cached = group >= 0 && group < kCached;
    if (cached)
      if (Comm* comm = cache_[group].load(std::memory_order_acquire)) return comm;
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<Comm>& comm = owned_[group];
    if (!comm) comm = make(st);
    if (!comm) {
      owned_.erase(group);
      return nullptr;
    }
    if (cached) cache_[group].store(comm.get(), std::memory_order_release);
    return comm.get();
  }

 private:
  static constexpr int32_t kCached = 64;
  std::array<std::atomic<Comm*>, kCached> cache_{};
  std::mutex mu_;
  std::map<int32_t, std::shared_ptr<Comm>> owned_;
};

// The decoded plan of one compiled custom call, shared by every device that runs it, and its groups'
// communicators.
struct PlanState {
  static ffi::TypeId id;
  Plan plan;
  ReduceOp op = ReduceOp::kSum;
  int64_t callsite = 0;
  // Where the ranks live when the mesh spans processes: processes[group * nranks + rank] is the job process
  // index hosting that rank (empty in a one-process program). A group inside one process runs in-process.
  std::vector<int32_t> processes;
  uint64_t fingerprint = 0;
  // The rank whose calls jaxcoll.stats() times: the first rank in this process of the first group with one, so
  // every process of a job times the sites it runs, once a call.
  int32_t timed_group = 0, timed_rank = 0;
  GroupCommunicators<Communicator> in_process;
  GroupCommunicators<CrossProcessCommunicator> cross_process;
};
ffi::TypeId PlanState::id = XLA_FFI_UNKNOWN_TYPE_ID;
constexpr ffi::TypeInfo kPlanStateInfo = ffi::MakeTypeInfo<PlanState>();

ffi::ErrorOr<std::unique_ptr<PlanState>> Instantiate(ffi::Span<const int32_t> words, int32_t reduce_op,
                                                     int64_t callsite, ffi::Span<const int32_t> processes) {
  auto state = std::make_unique<PlanState>();
  if (Status st = decode_plan(std::span<const int32_t>(words.begin(), words.size()), state->plan); !st.ok())
    return ffi::Unexpected(ffi::Error::InvalidArgument("jaxcoll callsite " + std::to_string(callsite) +
                                       ": the custom call's plan attribute is malformed: " + st.message()));
  const auto op = reduce_op_from_code(reduce_op);
  if (!op)
    return ffi::Unexpected(ffi::Error::InvalidArgument("jaxcoll callsite " + std::to_string(callsite) +
                                                       ": reduce_op=" + std::to_string(reduce_op) + " is not " +
                                                       reduce_op_codes()));
  state->op = *op;
  state->callsite = callsite;
  if (processes.size() % state->plan.nranks)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "jaxcoll callsite " + std::to_string(callsite) + ": the processes attribute has " +
        std::to_string(processes.size()) + " entries, not a multiple of the plan's " +
        std::to_string(state->plan.nranks) + " ranks"));
  state->processes.assign(processes.begin(), processes.end());
  state->fingerprint = plan_fingerprint(words.begin(), words.size(), reduce_op);
  if (!state->processes.empty()) {
    // The group spans processes: the job's runtime must be set up before the call runs, and it is here, once,
    // when the first such call is compiled (the lowering only emits the call: docs/multiprocess.md).
    if (Status st = set_up_world(); !st.ok()) return ffi::Unexpected(ffi::Error::Internal(st.message()));
    const World* w = world();
    const int64_t first = std::find(state->processes.begin(), state->processes.end(), w ? w->process : 0) -
                          state->processes.begin();  // past the end: this process runs none of the ranks
    state->timed_group = static_cast<int32_t>(first / state->plan.nranks);
    state->timed_rank = static_cast<int32_t>(first % state->plan.nranks);
  }
  return state;
}

ffi::Error ErrorOf(const Status& st) { return ffi::Error::Internal(st.message()); }

ffi::Future Failed(ffi::Error error) {
  ffi::Promise promise;
  promise.SetError(std::move(error));
  return ffi::Future(promise);
}

ffi::Future Done() {
  ffi::Promise promise;
  promise.SetAvailable();
  return ffi::Future(promise);
}

// A call returns a future: a rank that arrives before its last peer must not hold its thread (it may be one of
// XLA's few intra-op pool threads, which a peer's call can be queued behind), so its future completes when the
// call does (communicator.hpp).
ffi::Future Execute(PlanState* state, ffi::RunId run_id, ffi::ThreadPool pool, ffi::AnyBuffer x,
                    ffi::Buffer<ffi::S32> rank_buf, ffi::Buffer<ffi::S32> group_buf,
                    ffi::Result<ffi::AnyBuffer> out) {
  if (!state) return Failed(ffi::Error::Internal("jaxcoll: the plan state is missing (instantiate did not run)"));
  const Plan& plan = state->plan;
  CallSite site{collective_name(plan.collective), state->callsite, 0};
  const int32_t rank = rank_buf.typed_data()[0];
  const int32_t group = group_buf.typed_data()[0];
  site.group = group;
  const auto dtype = dtype_of(x.element_type());
  if (!dtype)
    return Failed(ffi::Error::InvalidArgument(site.describe() + ": unsupported element type " +
                                              std::to_string(static_cast<int>(x.element_type())) +
                                              "; jaxcoll supports float16, bfloat16, float32, float64, int8, "
                                              "int32, int64, uint8, uint32 and bool"));
  if (out->element_type() != x.element_type())
    return Failed(ffi::Error::InvalidArgument(site.describe() +
                                              ": the result's element type differs from the operand's"));
  if (rank < 0 || rank >= plan.nranks)
    return Failed(ffi::Error::InvalidArgument(site.describe() + ": rank operand " + std::to_string(rank) +
                                              " is out of range for a plan of " + std::to_string(plan.nranks) +
                                              " ranks; pass lax.axis_index over the collective's axes"));
  CallBuffers b{x.untyped_data(), out->untyped_data(), static_cast<int64_t>(x.element_count()),
                static_cast<int64_t>(out->element_count()), *dtype, state->op};
  // One rank of each call is timed, from its arrival to its call's end (what its step waits for).
  const bool timed = group == state->timed_group && rank == state->timed_rank;
  const auto arrived = std::chrono::steady_clock::now();
  const int64_t callsite = state->callsite, bytes = static_cast<int64_t>(x.size_bytes());
  auto record = [timed, arrived, callsite, bytes](const Status& st) {
    if (timed && st.ok())
      record_call(callsite, bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - arrived).count());
  };
  ffi::Promise promise;
  Completion complete = [promise, record](const Status& st) mutable {
    record(st);
    if (st.ok())
      promise.SetAvailable();
    else
      promise.SetError(ErrorOf(st));
  };
  bool pending = false;

  // A group whose ranks live in several processes (a mesh of a jax.distributed job) runs in cross_process.hpp.
  if (!state->processes.empty()) {
    const int64_t ngroups = static_cast<int64_t>(state->processes.size()) / plan.nranks;
    if (group < 0 || group >= ngroups)
      return Failed(ffi::Error::InvalidArgument(site.describe() + ": group operand " + std::to_string(group) +
                                                " is out of range for " + std::to_string(ngroups) + " groups"));
    const int32_t* procs = state->processes.data() + int64_t(group) * plan.nranks;
    if (std::any_of(procs, procs + plan.nranks, [&](int32_t p) { return p != procs[0]; })) {
      Status made;
      CrossProcessCommunicator* group_comm = state->cross_process.get(group, [&](Status& st) {
        return cross_process_communicator_for(state->callsite, group, plan,
                                              std::vector<int32_t>(procs, procs + plan.nranks), state->fingerprint,
                                              b.input_elements, *dtype, st);
      }, made);
      if (!group_comm) return Failed(ffi::Error::InvalidArgument(made.message()));
      const Status st = execute_cross_process_rank(*group_comm, run_id.run_id, plan, rank, b, site,
                                                   default_timeout_s(), std::move(complete), pending);
      if (pending) return ffi::Future(promise);
      record(st);
      return st.ok() ? Done() : Failed(ErrorOf(st));
    }
  }

  Status made;
  Communicator* comm = state->in_process.get(
      group, [&](Status& st) { return communicator_for(state->callsite, group, plan.nranks, st); }, made);
  if (!comm) return Failed(ffi::Error::InvalidArgument(made.message()));
  // Helpers and completions go to XLA's intra-op pool; the pool handle is valid for the length of this call,
  // which is as long as the leader schedules on it. One helper per core beyond the leader's own.
  static const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));  // read once
  const Helpers helpers{[&pool](std::function<void()> task) { pool.Schedule(std::move(task)); },
                        static_cast<int>(std::min<int64_t>(pool.num_threads(), cores - 1))};
  const Status st = execute_rank(*comm, run_id.run_id, plan, rank, b, site, default_timeout_s(), helpers,
                                 std::move(complete), pending);
  if (pending) return ffi::Future(promise);
  record(st);
  return st.ok() ? Done() : Failed(ErrorOf(st));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kInstantiate, Instantiate, bind_call_attributes(ffi::Ffi::BindInstantiate()));

XLA_FFI_DEFINE_HANDLER(kExecute, Execute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::State<PlanState>>()
                           .Ctx<ffi::RunId>()
                           .Ctx<ffi::ThreadPool>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Ret<ffi::AnyBuffer>());

XLA_FFI_Error* instantiate(XLA_FFI_CallFrame* frame) { return kInstantiate(frame); }
XLA_FFI_Error* execute(XLA_FFI_CallFrame* frame) { return kExecute(frame); }
XLA_FFI_TypeId* state_type_id() { return &PlanState::id; }
const XLA_FFI_TypeInfo* state_type_info() { return &kPlanStateInfo; }

}  // namespace jaxcoll::xla_cpu
