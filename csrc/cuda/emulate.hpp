// The emulated-rank harness: a whole group on ONE GPU (docs/cuda.md, "Testing on one GPU"). N slots on the same
// device, one launch holding every rank's thread blocks (resident together: the launch is cooperative), peers
// reached through ordinary device pointers. It runs exactly the kernel XLA's handler runs, so a plan that
// passes here has exercised every step, protocol and synchronisation of the executor except peer-to-peer
// memory between GPUs.
#pragma once

#include <memory>
#include <vector>

#include "csrc/cuda/launcher.hpp"

namespace jaxcoll::cuda {

class EmulatedGroup {
 public:
  struct Options {
    int device = 0;
    Protocol protocol = Protocol::kAuto;  // kAuto: what the plan asks for, else by size
    int blocks_per_lane = 0;              // 0: chosen as for XLA's calls
    double timeout_s = 300;
    // Elements by which rank r's input and output start past their allocation's (aligned) base, so a test
    // reaches the kernel's element-by-element path and its vector peels as XLA's sliced buffers would. Empty:
    // every rank at offset 0.
    std::vector<int64_t> input_offsets, output_offsets;
    // Stage every rank's buffers in its slot, as a group spanning processes does on the bulk protocol
    // (docs/cuda.md, "Groups across processes"): peers then reach them by slot offsets, never by pointers.
    bool staged = false;
    PacketPolls polls = PacketPolls::kDefault;  // the kernel's variants (Launcher::Options)
    CounterScope scope = CounterScope::kDefault;
  };

  static Status create(const Plan& plan, CallShape shape, const Options& options, std::unique_ptr<EmulatedGroup>& out);
  ~EmulatedGroup();

  // One call on host buffers (inputs[r], outputs[r] for every rank): copied to the device, run, copied back.
  Status run_host(const std::vector<const void*>& inputs, const std::vector<void*>& outputs);

  // Seconds per call over `iters` calls on the group's device buffers: back-to-back launches, or one CUDA
  // graph of `iters` calls replayed.
  Status time_calls(int iters, bool graph, double& seconds);

  Protocol protocol() const { return launcher_->options().protocol; }
  int blocks_per_lane() const { return launcher_->options().blocks_per_lane; }
  // Bytes every call reads and writes, over all ranks.
  int64_t traffic_bytes() const;

 private:
  EmulatedGroup() = default;
  Status check(Status launched);
  Status enqueue();
  char* input(size_t rank) const;  // rank's device buffers, at their offsets
  char* output(size_t rank) const;

  Plan plan_;
  PlanImage image_;
  CallShape shape_;
  Options options_;
  std::vector<DeviceMemory> slots_, inputs_, outputs_;
  std::unique_ptr<ErrorRecordMemory> error_;
  std::unique_ptr<Launcher> launcher_;
  Stream stream_ = nullptr;
};

// Device-to-device cudaMemcpy bandwidth on `device`: bytes copied per second, best of `iters` copies.
Status memcpy_bandwidth(int device, size_t bytes, int iters, double& bytes_per_s);

}  // namespace jaxcoll::cuda
