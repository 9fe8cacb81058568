#include "csrc/cuda/emulate.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "csrc/cuda/cuda_status.hpp"

namespace jaxcoll::cuda {

namespace {

cudaStream_t native(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

Status EmulatedGroup::create(const Plan& plan, CallShape shape, const Options& o, std::unique_ptr<EmulatedGroup>& out) {
  std::string why;
  if (device_count(&why) <= o.device)
    return Status::Error("no CUDA device " + std::to_string(o.device) + " (" + why + ")");
  if (plan.nranks > kMaxLaunchRanks)
    return Status::Error("the emulated-rank harness runs at most " + std::to_string(kMaxLaunchRanks) +
                         " ranks in one launch, the plan has " + std::to_string(plan.nranks));
  for (const auto* offsets : {&o.input_offsets, &o.output_offsets}) {
    if (!offsets->empty() && offsets->size() != size_t(plan.nranks))
      return Status::Error("the harness takes one buffer offset per rank (" + std::to_string(plan.nranks) +
                           "), got " + std::to_string(offsets->size()));
    for (int64_t off : *offsets)
      if (off < 0) return Status::Error("a buffer offset must be at least 0 elements, got " + std::to_string(off));
  }
  auto g = std::unique_ptr<EmulatedGroup>(new EmulatedGroup());
  g->plan_ = plan;
  g->options_ = o;
  if (Status st = check_shape(g->plan_, shape); !st.ok()) return st;
  g->shape_ = shape;
  if (Status st = build_plan_image(g->plan_, g->image_); !st.ok()) return st;
  const int64_t in_bytes = shape.input_elements * int64_t(dtype_size(shape.dtype));
  Protocol protocol = o.protocol;
  if (protocol == Protocol::kLL && !g->image_.ll_ok)
    return Status::Error("the ll protocol cannot run this plan: " + g->image_.ll_reason);
  if (protocol == Protocol::kAuto)
    if (Status st = choose_protocol(g->image_, in_bytes, ll_max_bytes(), protocol); !st.ok()) return st;
  int blocks = o.blocks_per_lane;
  if (blocks <= 0) {
    if (Status st = choose_blocks_per_lane(g->image_, shape, o.device, plan.nranks, protocol, blocks); !st.ok())
      return st;
  }
  const SlotLayout layout = slot_layout(g->image_, shape, protocol, o.staged);
  std::vector<char*> slots;
  for (int32_t r = 0; r < plan.nranks; ++r) {
    DeviceMemory m;
    if (Status st = DeviceMemory::allocate(o.device, size_t(layout.bytes), m); !st.ok()) return st;
    slots.push_back(m.get());
    g->slots_.push_back(std::move(m));
  }
  const size_t dsize = dtype_size(shape.dtype);
  for (int32_t r = 0; r < plan.nranks; ++r) {
    DeviceMemory in, outm;
    const int64_t in_off = o.input_offsets.empty() ? 0 : o.input_offsets[r];
    const int64_t out_off = o.output_offsets.empty() ? 0 : o.output_offsets[r];
    if (Status st = DeviceMemory::allocate(o.device, size_t(shape.input_elements + in_off) * dsize, in); !st.ok())
      return st;
    if (Status st = DeviceMemory::allocate(o.device, size_t(shape.output_elements + out_off) * dsize, outm);
        !st.ok())
      return st;
    g->inputs_.push_back(std::move(in));
    g->outputs_.push_back(std::move(outm));
  }
  if (Status st = ErrorRecordMemory::allocate(g->error_); !st.ok()) return st;
  Launcher::Options lo;
  lo.device = o.device;
  lo.first_rank = 0;
  lo.launch_ranks = plan.nranks;
  lo.protocol = protocol;
  lo.blocks_per_lane = blocks;
  lo.timeout_s = o.timeout_s;
  lo.staged = o.staged;
  lo.one_device = true;
  lo.polls = o.polls;
  lo.scope = o.scope;
  int resident = 0;
  if (Status st = resident_blocks(o.device, shape, resident); !st.ok()) return st;
  if (plan.nranks * g->image_.max_lanes * blocks > resident)
    return Status::Error("emulating " + std::to_string(plan.nranks) + " ranks x " +
                         std::to_string(g->image_.max_lanes) + " lanes x " + std::to_string(blocks) +
                         " blocks per lane needs more thread blocks resident at once than device " +
                         std::to_string(o.device) + " holds (" + std::to_string(resident) + ")");
  if (Status st = Launcher::create(g->plan_, g->image_, shape, layout, slots, g->error_->get(), lo, g->launcher_);
      !st.ok())
    return st;
  cudaSetDevice(o.device);
  cudaStream_t s = nullptr;
  JAXCOLL_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  g->stream_ = reinterpret_cast<Stream>(s);
  out = std::move(g);
  return {};
}

EmulatedGroup::~EmulatedGroup() {
  if (stream_) {
    cudaStreamSynchronize(native(stream_));
    cudaStreamDestroy(native(stream_));
  }
}

int64_t EmulatedGroup::traffic_bytes() const {
  return jaxcoll::cuda::traffic_bytes(image_, shape_.block, dtype_size(shape_.dtype), accum_size(shape_.dtype));
}

char* EmulatedGroup::input(size_t rank) const {
  const int64_t off = options_.input_offsets.empty() ? 0 : options_.input_offsets[rank];
  return inputs_[rank].get() + off * int64_t(dtype_size(shape_.dtype));
}

char* EmulatedGroup::output(size_t rank) const {
  const int64_t off = options_.output_offsets.empty() ? 0 : options_.output_offsets[rank];
  return outputs_[rank].get() + off * int64_t(dtype_size(shape_.dtype));
}

Status EmulatedGroup::enqueue() {
  std::vector<const void*> in;
  std::vector<void*> out;
  for (size_t r = 0; r < inputs_.size(); ++r) {
    in.push_back(input(r));
    out.push_back(output(r));
  }
  return launcher_->enqueue(in.data(), out.data(), stream_);
}

// After the stream drained: a failure the kernel recorded is the message; else the stream's own error.
Status EmulatedGroup::check(Status launched) {
  const cudaError_t synced = cudaStreamSynchronize(native(stream_));
  if (error_->failed()) return Status::Error(launcher_->describe_failure(*error_->get()));
  if (!launched.ok()) return launched;
  if (synced != cudaSuccess) return cuda_error(synced, "the executor kernel");
  return {};
}

Status EmulatedGroup::run_host(const std::vector<const void*>& inputs, const std::vector<void*>& outputs) {
  if (inputs.size() != size_t(plan_.nranks) || outputs.size() != size_t(plan_.nranks))
    return Status::Error("the harness needs one input and one output per rank (" + std::to_string(plan_.nranks) + ")");
  if (error_->failed()) return Status::Error("an earlier call of this group failed: " +
                                             launcher_->describe_failure(*error_->get()));
  cudaSetDevice(options_.device);
  const size_t dsize = dtype_size(shape_.dtype);
  for (size_t r = 0; r < inputs.size(); ++r)
    JAXCOLL_CUDA_TRY(cudaMemcpyAsync(input(r), inputs[r], size_t(shape_.input_elements) * dsize,
                                     cudaMemcpyHostToDevice, native(stream_)), "copy of an input to the device");
  Status launched = enqueue();
  if (launched.ok())
    for (size_t r = 0; r < outputs.size(); ++r)
      JAXCOLL_CUDA_TRY(cudaMemcpyAsync(outputs[r], output(r), size_t(shape_.output_elements) * dsize,
                                       cudaMemcpyDeviceToHost, native(stream_)), "copy of an output to the host");
  return check(launched);
}

Status EmulatedGroup::time_calls(int iters, bool graph, double& seconds) {
  cudaSetDevice(options_.device);
  const cudaStream_t s = native(stream_);
  if (Status st = check(enqueue()); !st.ok()) return st;  // warm up
  cudaEvent_t start, stop;
  JAXCOLL_CUDA_TRY(cudaEventCreate(&start), "cudaEventCreate");
  JAXCOLL_CUDA_TRY(cudaEventCreate(&stop), "cudaEventCreate");
  struct Events {
    cudaEvent_t a, b;
    ~Events() { cudaEventDestroy(a), cudaEventDestroy(b); }
  } events{start, stop};
  Status launched;
  if (graph) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    JAXCOLL_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    for (int i = 0; i < iters && launched.ok(); ++i) launched = enqueue();
    const cudaError_t ended = cudaStreamEndCapture(s, &g);
    if (!launched.ok()) return launched;
    JAXCOLL_CUDA_TRY(ended, "cudaStreamEndCapture (cooperative launches under capture)");
    const cudaError_t inst = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    JAXCOLL_CUDA_TRY(inst, "cudaGraphInstantiate");
    struct Exec {
      cudaGraphExec_t e;
      ~Exec() { cudaGraphExecDestroy(e); }
    } owned{exec};
    JAXCOLL_CUDA_TRY(cudaGraphLaunch(exec, s), "cudaGraphLaunch");  // warm up the graph
    if (Status st = check({}); !st.ok()) return st;
    JAXCOLL_CUDA_TRY(cudaEventRecord(start, s), "cudaEventRecord");
    JAXCOLL_CUDA_TRY(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
    JAXCOLL_CUDA_TRY(cudaEventRecord(stop, s), "cudaEventRecord");
  } else {
    JAXCOLL_CUDA_TRY(cudaEventRecord(start, s), "cudaEventRecord");
    for (int i = 0; i < iters && launched.ok(); ++i) launched = enqueue();
    JAXCOLL_CUDA_TRY(cudaEventRecord(stop, s), "cudaEventRecord");
  }
  if (Status st = check(launched); !st.ok()) return st;
  float ms = 0;
  JAXCOLL_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  seconds = double(ms) * 1e-3 / std::max(iters, 1);
  return {};
}

Status memcpy_bandwidth(int device, size_t bytes, int iters, double& bytes_per_s) {
  DeviceMemory a, b;
  if (Status st = DeviceMemory::allocate(device, bytes, a); !st.ok()) return st;
  if (Status st = DeviceMemory::allocate(device, bytes, b); !st.ok()) return st;
  cudaSetDevice(device);
  cudaEvent_t start, stop;
  JAXCOLL_CUDA_TRY(cudaEventCreate(&start), "cudaEventCreate");
  JAXCOLL_CUDA_TRY(cudaEventCreate(&stop), "cudaEventCreate");
  double best = 0;
  for (int i = 0; i < std::max(iters, 1) + 1; ++i) {  // the first copy warms up
    cudaEventRecord(start);
    cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    const cudaError_t err = cudaEventSynchronize(stop);
    if (err != cudaSuccess) {
      cudaEventDestroy(start), cudaEventDestroy(stop);
      return cuda_error(err, "cudaMemcpy device to device");
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i > 0 && ms > 0) best = std::max(best, double(bytes) / (double(ms) * 1e-3));
  }
  cudaEventDestroy(start), cudaEventDestroy(stop);
  bytes_per_s = best;
  return {};
}

}  // namespace jaxcoll::cuda
