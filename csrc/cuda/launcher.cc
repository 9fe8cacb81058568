#include "csrc/cuda/launcher.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "csrc/cuda/cuda_status.hpp"
#include "csrc/cuda/kernels.hpp"
#include "csrc/env.hpp"
#include "csrc/layout.hpp"

namespace jaxcoll::cuda {

namespace {

// Makes `device` current for a scope and restores the caller's device (XLA's threads have their own).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

int64_t packet_size(size_t esize) { return esize <= 4 ? 8 : 16; }

}  // namespace

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device is visible";
  return n;
}

int64_t ll_max_bytes() {
  return env_settings().cuda_ll_bytes.value_or(int64_t{64} << 10);
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
  if (this != &o) {
    this->~DeviceMemory();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

DeviceMemory::~DeviceMemory() {
  if (!ptr_) return;
  DeviceScope scope(device_);
  cudaFree(ptr_);
  ptr_ = nullptr;
}

Status DeviceMemory::allocate(int device, size_t bytes, DeviceMemory& out) {
  DeviceScope scope(device);
  DeviceMemory m;
  m.device_ = device;
  m.bytes_ = bytes;
  void* p = nullptr;
  JAXCOLL_CUDA_TRY(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "cudaMalloc of " + std::to_string(bytes) +
                                                                     " bytes on device " + std::to_string(device));
  m.ptr_ = static_cast<char*>(p);
  JAXCOLL_CUDA_TRY(cudaMemset(p, 0, std::max<size_t>(bytes, 256)), "cudaMemset");
  out = std::move(m);
  return {};
}

Status ErrorRecordMemory::allocate(std::unique_ptr<ErrorRecordMemory>& out) {
  auto m = std::unique_ptr<ErrorRecordMemory>(new ErrorRecordMemory());
  void* p = nullptr;
  JAXCOLL_CUDA_TRY(cudaHostAlloc(&p, sizeof(ErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable),
                   "cudaHostAlloc of the error record");
  std::memset(p, 0, sizeof(ErrorRecord));
  m->rec_ = static_cast<ErrorRecord*>(p);
  out = std::move(m);
  return {};
}

ErrorRecordMemory::~ErrorRecordMemory() {
  if (rec_) cudaFreeHost(rec_);
}

bool ErrorRecordMemory::failed() const {
  return reinterpret_cast<const volatile uint32_t*>(&rec_->code)[0] != 0;
}

Status check_shape(const Plan& plan, CallShape& s) {
  if (s.input_elements % plan.in_blocks)
    return Status::Error("input of " + std::to_string(s.input_elements) + " elements does not split into the plan's "
                         "in_blocks=" + std::to_string(plan.in_blocks) + " blocks");
  s.block = s.input_elements / plan.in_blocks;
  if (s.output_elements != s.block * plan.out_blocks)
    return Status::Error("output has " + std::to_string(s.output_elements) + " elements, the plan needs "
                         "out_blocks*block=" + std::to_string(plan.out_blocks) + "*" + std::to_string(s.block));
  if (plan.in_place && collective_info(plan.collective).in_place == InPlace::kSame &&
      s.input_elements != s.output_elements)
    return Status::Error("an in-place plan needs input and output of one size, got " +
                         std::to_string(s.input_elements) + " and " + std::to_string(s.output_elements) + " elements");
  return {};
}

SlotLayout slot_layout(const PlanImage& im, const CallShape& s, Protocol protocol, bool staged) {
  const int64_t dsize = int64_t(dtype_size(s.dtype)), asize = int64_t(accum_size(s.dtype));
  int64_t chunks[3] = {0, 0, 0};
  uint32_t shared = 0;
  for (const DeviceRank& r : im.ranks) {
    chunks[0] = std::max<int64_t>(chunks[0], r.input_chunks);
    chunks[1] = std::max<int64_t>(chunks[1], r.output_chunks);
    chunks[2] = std::max<int64_t>(chunks[2], r.scratch_chunks);
    shared |= r.shared;
  }
  SlotLayout l;
  int64_t at = round_up(sizeof(SlotHeader), 256);
  l.semaphores = at;
  at = round_up(at + 8 * int64_t(im.max_semaphores) * kMaxBlocksPerLane, 256);
  l.scratch = at;
  at = round_up(at + chunks[2] / im.chunk_factor * s.block * asize, 256);
  l.staging = at;
  if (im.in_place && collective_info(static_cast<Collective>(im.collective)).in_place == InPlace::kOutputInInput)
    at = round_up(at + s.input_elements * dsize, 256);
  if (staged && protocol == Protocol::kBulk) {
    // In-place all_gather and other in-place plans run inside the output copy; the input copy is kept apart so
    // the staging never depends on which plan runs (one extra input's worth of slot, never read by peers then).
    l.io_input = at;
    at = round_up(at + s.input_elements * dsize, 256);
    l.io_output = at;
    at = round_up(at + s.output_elements * dsize, 256);
  }
  if (protocol == Protocol::kLL) {
    for (int b = 0; b < 3; ++b) {
      if (!(shared >> b & 1u)) continue;
      l.packets[b] = at;
      l.packet_bytes[b] = round_up(chunks[b] / im.chunk_factor * s.block * packet_size(b == 2 ? asize : dsize), 256);
      at += 2 * l.packet_bytes[b];
    }
  }
  l.bytes = at;
  return l;
}

Status resident_blocks(int device, const CallShape& shape, int& blocks) {
  DeviceScope scope(device);
  int sms = 0, per_sm = 0;
  JAXCOLL_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  JAXCOLL_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, plan_kernel_for(shape.dtype, shape.op),
                                                                 kThreads, 0),
                   "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  blocks = sms * per_sm;
  return {};
}

int wanted_blocks_per_lane(const PlanImage& im, const CallShape& shape, Protocol protocol) {
  // Bulk: about 1 MiB of input per block and lane keeps each block busy long enough to amortise its steps.
  // Packets: a block per kThreads elements of the larger of a lane's input and output share, up to
  // kMaxPacketBlocks, so an 8 KiB float32 all_reduce polls with one thread per element on 4 blocks
  // (tools/gpu_floor.cu: 11.8 us on one block, 6.0 on four, at 8 ranks).
  const int lanes_of_rank = std::max(im.max_lanes, 1);
  const int64_t per_lane = shape.input_elements * int64_t(dtype_size(shape.dtype)) / lanes_of_rank;
  const int64_t packet_elements = std::max(shape.input_elements, shape.output_elements) / lanes_of_rank;
  const int want = protocol == Protocol::kLL
                       ? int(std::clamp<int64_t>((packet_elements + kThreads - 1) / kThreads, 1, kMaxPacketBlocks))
                       : int(std::clamp<int64_t>((per_lane + (1 << 20) - 1) >> 20, 1, kMaxBlocksPerLane));
  return std::min(env_settings().cuda_blocks.value_or(want), kMaxBlocksPerLane);
}

Status choose_blocks_per_lane(const PlanImage& im, const CallShape& shape, int device, int launch_ranks,
                              Protocol protocol, int& blocks) {
  int resident = 0;
  if (Status st = resident_blocks(device, shape, resident); !st.ok()) return st;
  const int lanes = launch_ranks * im.max_lanes;
  const int most = resident / std::max(lanes, 1);
  if (most < 1)
    return Status::Error("the plan needs " + std::to_string(lanes) + " thread blocks resident at once (" +
                         std::to_string(launch_ranks) + " rank(s) x " + std::to_string(im.max_lanes) +
                         " lanes) but device " + std::to_string(device) + " holds " + std::to_string(resident));
  blocks = std::min(wanted_blocks_per_lane(im, shape, protocol), most);
  return {};
}

Status Launcher::create(const Plan& plan, const PlanImage& im, const CallShape& shape, const SlotLayout& layout,
                        const std::vector<char*>& slots, ErrorRecord* error, const Options& o,
                        std::unique_ptr<Launcher>& out) {
  if (o.launch_ranks < 1 || o.launch_ranks > kMaxLaunchRanks || o.first_rank < 0 ||
      o.first_rank + o.launch_ranks > im.nranks)
    return Status::Error("a launch runs 1.." + std::to_string(kMaxLaunchRanks) + " ranks of the group, got ranks [" +
                         std::to_string(o.first_rank) + ", " + std::to_string(o.first_rank + o.launch_ranks) + ")");
  if (o.blocks_per_lane < 1 || o.blocks_per_lane > kMaxBlocksPerLane)
    return Status::Error("blocks_per_lane must be 1.." + std::to_string(kMaxBlocksPerLane) + ", got " +
                         std::to_string(o.blocks_per_lane));
  if (slots.size() != size_t(im.nranks)) return Status::Error("the slot table must name one slot per rank");
  if (!plan_kernel_for(shape.dtype, shape.op))
    return Status::Error(std::string("the CUDA executor has no kernel for ") + dtype_name(shape.dtype));
  auto l = std::unique_ptr<Launcher>(new Launcher());
  l->plan_ = &plan;
  l->image_ = &im;
  l->shape_ = shape;
  l->options_ = o;

  // What the kernel would otherwise work out with 64-bit divisions at every step of every call: each chunk
  // reference's first element, each data step's elements and each block's share of them (whole 16-byte vectors),
  // each packed output run's and each launched rank's packed input.
  const int64_t k = im.chunk_factor, block = shape.block, B = o.blocks_per_lane;
  const int64_t vec = 16 / int64_t(dtype_size(shape.dtype));
  auto split = [](int64_t start, int64_t n, int64_t parts, int64_t v) {
    const int64_t per = ((n + parts - 1) / parts + v - 1) / v * v;
    return Span{start, n, per};
  };
  std::vector<int64_t> ref_start(im.refs.size());
  for (size_t j = 0; j < im.refs.size(); ++j) ref_start[j] = chunk_start(k, block, im.refs[j].index);
  std::vector<Span> step_span(im.steps.size(), Span{0, 0, 0});
  for (size_t i = 0; i < im.steps.size(); ++i) {
    const DeviceStep& st = im.steps[i];
    if (st.nsrc + st.ndst == 0) continue;
    const ChunkRef& r = im.refs[size_t(st.first_ref)];
    const ElementRange e = chunk_range(k, block, r.index, r.count);
    step_span[i] = split(e.start, e.size(), B, vec);
  }
  std::vector<Span> unpack_span(im.unpack.size());
  for (const DeviceRank& dr : im.ranks)
    for (int32_t u = 0; u < dr.nunpack; ++u) {
      const ChunkRun& run = im.unpack[size_t(dr.first_unpack + u)];
      const ElementRange e = chunk_range(k, block, run.index, run.count);
      unpack_span[size_t(dr.first_unpack + u)] = split(e.start, e.size(), dr.nlanes * B, 1);
    }

  // One allocation holds every array the kernel reads.
  struct Section {
    const void* data;
    size_t bytes;
    size_t at;
  };
  Section sections[] = {
      {im.ranks.data(), im.ranks.size() * sizeof(DeviceRank), 0},
      {im.lanes.data(), im.lanes.size() * sizeof(DeviceLane), 0},
      {im.steps.data(), im.steps.size() * sizeof(DeviceStep), 0},
      {im.refs.data(), im.refs.size() * sizeof(ChunkRef), 0},
      {im.signals_per_call.data(), im.signals_per_call.size() * sizeof(int32_t), 0},
      {im.unpack.data(), im.unpack.size() * sizeof(ChunkRun), 0},
      {slots.data(), slots.size() * sizeof(char*), 0},
      {ref_start.data(), ref_start.size() * sizeof(int64_t), 0},
      {step_span.data(), step_span.size() * sizeof(Span), 0},
      {unpack_span.data(), unpack_span.size() * sizeof(Span), 0},
  };
  size_t total = 0;
  for (Section& s : sections) {
    s.at = total;
    total += (s.bytes + 15) / 16 * 16;
  }
  if (Status st = DeviceMemory::allocate(o.device, total, l->arrays_); !st.ok()) return st;
  {
    DeviceScope scope(o.device);
    for (const Section& s : sections)
      if (s.bytes) JAXCOLL_CUDA_TRY(cudaMemcpy(l->arrays_.get() + s.at, s.data, s.bytes, cudaMemcpyHostToDevice),
                                    "cudaMemcpy of the plan");
  }
  char* base = l->arrays_.get();
  KernelParams& p = l->params_;
  p.ranks = reinterpret_cast<const DeviceRank*>(base + sections[0].at);
  p.lanes = reinterpret_cast<const DeviceLane*>(base + sections[1].at);
  p.steps = reinterpret_cast<const DeviceStep*>(base + sections[2].at);
  p.refs = reinterpret_cast<const ChunkRef*>(base + sections[3].at);
  p.signals_per_call = reinterpret_cast<const int32_t*>(base + sections[4].at);
  p.unpack = reinterpret_cast<const ChunkRun*>(base + sections[5].at);
  p.slots = reinterpret_cast<char* const*>(base + sections[6].at);
  p.ref_start = reinterpret_cast<const int64_t*>(base + sections[7].at);
  p.step_span = reinterpret_cast<const Span*>(base + sections[8].at);
  p.unpack_span = reinterpret_cast<const Span*>(base + sections[9].at);
  p.error = error;
  p.layout = layout;
  p.timeout_ns = uint64_t(std::max(o.timeout_s, 1e-3) * 1e9);
  p.nranks = im.nranks;
  p.max_semaphores = im.max_semaphores;
  p.max_lanes = im.max_lanes;
  p.first_rank = o.first_rank;
  p.launch_ranks = o.launch_ranks;
  p.blocks_per_lane = o.blocks_per_lane;
  p.protocol = static_cast<int32_t>(o.protocol);
  p.staged = o.staged && o.protocol == Protocol::kBulk;
  for (int i = 0; i < o.launch_ranks; ++i) {
    const DeviceRank& dr = im.ranks[size_t(o.first_rank + i)];
    p.first_lane[i] = dr.first_lane;
    p.pack[i] = split(0, int64_t(dr.input_chunks / k) * block, dr.nlanes * B, 1);
  }
  const EnvSettings& env = env_settings();
  CounterScope scope = o.scope;
  if (scope == CounterScope::kDefault)
    scope = env.cuda_scope.value_or("narrowest") == "system" ? CounterScope::kSystem : CounterScope::kNarrowest;
  p.own_scope = scope == CounterScope::kNarrowest;
  p.peer_scope = p.own_scope && o.one_device;
  PacketPolls polls = o.polls;
  if (polls == PacketPolls::kDefault)
    polls = env.cuda_poll.value_or("in_flight") == "in_order" ? PacketPolls::kInOrder : PacketPolls::kInFlight;
  p.polls_in_flight = polls == PacketPolls::kInFlight;
  if (p.staged && (layout.io_input == 0 || layout.io_output == 0))
    return Status::Error("a staged launcher needs a slot layout with staging areas (slot_layout(..., staged=true))");
  for (int i = 0; i < o.launch_ranks; ++i) l->own_slots_.push_back(slots[o.first_rank + i]);
  DeviceCall who;
  who.callsite = o.callsite;
  who.group = o.group;
  who.first_rank = o.first_rank;
  who.launch_ranks = o.launch_ranks;
  l->step_times_ = std::make_unique<StepTimes>(
      plan, StepSizes{k, block, dtype_size(shape.dtype), accum_size(shape.dtype)}, who);
  out = std::move(l);
  return {};
}

Status Launcher::enqueue(const void* const* inputs, void* const* outputs, Stream stream) const {
  KernelParams p = params_;
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  StepTimes::Buffer* traced = nullptr;
  if (Status st = step_times_->begin(stream, traced, p.step_times); !st.ok()) return st;
  const size_t dsize = dtype_size(shape_.dtype);
  const size_t in_bytes = size_t(shape_.input_elements) * dsize, block_bytes = size_t(shape_.block) * dsize;
  const bool in_place = image_->in_place;
  const InPlace aliasing = collective_info(static_cast<Collective>(image_->collective)).in_place;
  // Across processes (staged), peers reach only the slot: the rank's buffers are copies in it, the input copied
  // in before the kernel and the output copied back after (NCCL's path for buffers it has not registered).
  const void* staged_in[kMaxLaunchRanks];
  void* staged_out[kMaxLaunchRanks];
  void* const* xla_outputs = outputs;
  if (p.staged) {
    for (int i = 0; i < options_.launch_ranks; ++i) {
      staged_in[i] = own_slots_[i] + p.layout.io_input;
      staged_out[i] = own_slots_[i] + p.layout.io_output;
      JAXCOLL_CUDA_TRY(cudaMemcpyAsync(const_cast<void*>(staged_in[i]), inputs[i], in_bytes, cudaMemcpyDeviceToDevice,
                                       s), "staging copy into the slot");
    }
    inputs = staged_in;
    outputs = staged_out;
  }
  // Stage XLA's separate buffers into the arrangement an in-place plan expects (docs/plan-ir.md).
  for (int i = 0; i < options_.launch_ranks; ++i) {
    const int rank = options_.first_rank + i;
    p.calls[i] = {inputs[i], outputs[i]};
    if (!in_place) continue;
    if (aliasing == InPlace::kInputInOutput) {
      char* mine = static_cast<char*>(outputs[i]) + size_t(rank) * block_bytes;
      if (mine != inputs[i])
        JAXCOLL_CUDA_TRY(cudaMemcpyAsync(mine, inputs[i], block_bytes, cudaMemcpyDeviceToDevice, s), "staging copy");
      p.calls[i].input = mine;
    } else if (aliasing == InPlace::kOutputInInput) {
      char* staging = own_slots_[i] + p.layout.staging;
      JAXCOLL_CUDA_TRY(cudaMemcpyAsync(staging, inputs[i], in_bytes, cudaMemcpyDeviceToDevice, s), "staging copy");
      p.calls[i] = {staging, staging + size_t(rank) * block_bytes};
    } else {
      if (outputs[i] != inputs[i])
        JAXCOLL_CUDA_TRY(cudaMemcpyAsync(outputs[i], inputs[i], in_bytes, cudaMemcpyDeviceToDevice, s), "staging copy");
      p.calls[i].input = outputs[i];
    }
  }

  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(options_.launch_ranks * image_->max_lanes * options_.blocks_per_lane));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0;
  config.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;  // every block resident at once, or the launch fails
  attr[0].val.cooperative = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  void* args[] = {&p};
  JAXCOLL_CUDA_TRY(cudaLaunchKernelExC(&config, plan_kernel_for(shape_.dtype, shape_.op), args),
                   "launch of the executor kernel (" + std::to_string(config.gridDim.x) + " blocks)");

  if (in_place && aliasing == InPlace::kOutputInInput)
    for (int i = 0; i < options_.launch_ranks; ++i)
      JAXCOLL_CUDA_TRY(cudaMemcpyAsync(outputs[i], p.calls[i].output, block_bytes, cudaMemcpyDeviceToDevice, s),
                       "copy out of the staging buffer");
  if (p.staged)
    for (int i = 0; i < options_.launch_ranks; ++i)
      JAXCOLL_CUDA_TRY(cudaMemcpyAsync(xla_outputs[i], outputs[i], size_t(shape_.output_elements) * dsize,
                                       cudaMemcpyDeviceToDevice, s), "copy out of the slot");
  return step_times_->end(stream, traced);
}

std::string Launcher::describe_failure(const ErrorRecord& rec) const {
  const Plan& plan = *plan_;
  const PlanImage& im = *image_;
  const uint64_t B = uint64_t(options_.blocks_per_lane), e = rec.epoch;
  const std::string call = "call " + std::to_string(e + 1) + " of this group";
  const std::string rank = "rank " + std::to_string(rec.rank);
  auto where = [&] {
    const bool real = rec.rank >= 0 && rec.rank < plan.nranks && rec.lane >= 0 &&
                      rec.lane < plan.ranks[rec.rank].nlanes;
    return real ? plan.where(rec.rank, rec.lane, rec.step) : rank;
  };
  std::string what;
  switch (static_cast<Failure>(rec.code)) {
    case Failure::kWait: {
      // The counter is the one of the signalling lane's block `rec.buffer`: it counts that block's signals.
      const uint64_t per_call = uint64_t(im.signals_per_call[size_t(rec.rank) * im.max_semaphores + rec.sem]);
      const int64_t got = int64_t(rec.have) - int64_t(e * per_call);
      std::string signallers;
      for (int32_t r = 0; r < plan.nranks; ++r) {
        const RankProgram& p = plan.ranks[r];
        bool sends = false;
        for (int32_t q = 0; q < p.nlanes && !sends; ++q) {
          const Lane& ln = plan.lanes[p.first_lane + q];
          for (int32_t i = 0; i < ln.nsteps && !sends; ++i) {
            const Step& t = plan.steps[ln.first_step + i];
            sends = t.op == Op::kSignal && t.peer == rec.rank && t.sem == rec.sem;
          }
        }
        if (sends) signallers += (signallers.empty() ? "" : ", ") + std::to_string(r);
      }
      what = where() + " waits on semaphore " + std::to_string(rec.sem) + ", which received " + std::to_string(got) +
             " signal(s) in " + call + " and needs " + std::to_string(rec.need - e * per_call) +
             (B > 1 ? " from thread block " + std::to_string(rec.buffer) + " of the signalling lane" : "") +
             " (ranks whose plan signals it: [" + signallers + "])";
      break;
    }
    case Failure::kEntry:
      what = rank + " waited for rank " + std::to_string(rec.peer) + " to arrive at " + call +
             ", and it never did: every rank of the group must run every call";
      break;
    case Failure::kExit:
      what = rank + " waited for rank " + std::to_string(rec.peer) + " to finish the steps of " + call +
             ", and it never did";
      break;
    case Failure::kPacket:
      what = where() + " waited for a packet of rank " + std::to_string(rec.peer) + "'s " +
             (rec.buffer >= 0 ? buffer_name(static_cast<BufferKind>(rec.buffer)) : "buffer") + " in " + call +
             ", and it never arrived (packet protocol: a chunk that is never written, or a peer that stopped)";
      break;
    case Failure::kBarrier:
      what = rank + ": lane " + std::to_string(rec.lane) + " never reached the lane barrier at step " +
             std::to_string(rec.step) + " of " + call;
      break;
    case Failure::kMeeting:
      what = where() + ": a thread block of the same lane never arrived at the meeting before this step";
      break;
    case Failure::kPrevious:
      what = rank + " waited for rank " + std::to_string(rec.peer) + " to finish the call before last (" +
             std::to_string(e - 1) + "), and it never did";
      break;
    case Failure::kPeerFailed:
      what = "process " + std::to_string(rec.peer) + " (hosting " + rank + ") failed to set up the group";
      break;
    case Failure::kProcessGone:
      what = "the process hosting " + rank + " (process " + std::to_string(rec.peer) + ") exited while the group ran";
      break;
    default:
      what = "unknown failure code " + std::to_string(rec.code);
  }
  return std::string(collective_name(plan.collective)) + " on the CUDA executor: " + what +
         " (timeout set by JAXCOLL_TIMEOUT; the plan may deadlock: check it with jaxcoll.lang's checker)";
}

}  // namespace jaxcoll::cuda
