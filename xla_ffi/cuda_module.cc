#include "xla_ffi/cuda_module.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "csrc/abi.hpp"
#include "csrc/cuda/emulate.hpp"
#include "csrc/cuda/slot_exchange.hpp"
#include "csrc/plan.hpp"
#include "xla_ffi/cuda_handler.hpp"
#include "xla_ffi/cuda_network.hpp"

namespace nb = nanobind;

namespace jaxcoll::xla_cuda {
namespace {

using Words = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Bytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

cuda::Protocol protocol_from(const std::string& name) {
  if (name == "auto") return cuda::Protocol::kAuto;
  if (name == "ll") return cuda::Protocol::kLL;
  if (name == "bulk") return cuda::Protocol::kBulk;
  throw nb::value_error(("protocol must be 'auto', 'll' or 'bulk', got '" + name + "'").c_str());
}

// The kernel's variants by name, for benchmarks that compare them in one process ("" is the default).
cuda::PacketPolls polls_from(const std::string& name) {
  if (name.empty()) return cuda::PacketPolls::kDefault;
  if (name == "in_flight") return cuda::PacketPolls::kInFlight;
  if (name == "in_order") return cuda::PacketPolls::kInOrder;
  throw nb::value_error(("poll must be '', 'in_flight' or 'in_order', got '" + name + "'").c_str());
}

cuda::CounterScope scope_from(const std::string& name) {
  if (name.empty()) return cuda::CounterScope::kDefault;
  if (name == "narrowest") return cuda::CounterScope::kNarrowest;
  if (name == "system") return cuda::CounterScope::kSystem;
  throw nb::value_error(("scope must be '', 'narrowest' or 'system', got '" + name + "'").c_str());
}

// A group on one GPU for `words`, sized for these calls; raises on any error.
std::unique_ptr<cuda::EmulatedGroup> emulated_group(const Words& words, const std::string& dtype_name,
                                                    int64_t input_elements, int64_t output_elements, int reduce_op,
                                                    double timeout_s, const std::string& protocol, int blocks,
                                                    int device, std::vector<int64_t> input_offsets = {},
                                                    std::vector<int64_t> output_offsets = {}, bool staged = false,
                                                    const std::string& poll = "", const std::string& scope = "") {
  Plan plan;
  if (Status st = decode_plan(std::span<const int32_t>(words.data(), words.shape(0)), plan); !st.ok())
    throw nb::value_error(("malformed jaxcoll plan: " + st.message()).c_str());
  const auto dtype = dtype_from_name(dtype_name);
  if (!dtype) throw nb::value_error(("unsupported dtype " + dtype_name).c_str());
  const auto op = reduce_op_from_code(reduce_op);
  if (!op)
    throw nb::value_error(("reduce_op must be " + reduce_op_codes() + ", got " + std::to_string(reduce_op)).c_str());
  if (!(timeout_s > 0)) throw nb::value_error("timeout_s must be positive");
  cuda::CallShape shape;
  shape.dtype = *dtype;
  shape.op = *op;
  shape.input_elements = input_elements;
  shape.output_elements = output_elements;
  cuda::EmulatedGroup::Options o;
  o.device = device;
  o.protocol = protocol_from(protocol);
  o.blocks_per_lane = blocks;
  o.timeout_s = timeout_s;
  o.input_offsets = std::move(input_offsets);
  o.output_offsets = std::move(output_offsets);
  o.staged = staged;
  o.polls = polls_from(poll);
  o.scope = scope_from(scope);
  std::unique_ptr<cuda::EmulatedGroup> g;
  if (Status st = cuda::EmulatedGroup::create(plan, shape, o, g); !st.ok()) throw std::runtime_error(st.message());
  return g;
}

nb::dict describe(const cuda::EmulatedGroup& g) {
  nb::dict d;
  d["protocol"] = cuda::protocol_name(g.protocol());
  d["blocks_per_lane"] = g.blocks_per_lane();
  d["traffic_bytes"] = g.traffic_bytes();
  return d;
}

}  // namespace

void add_bindings(nb::module_& m) {
  m.def("cuda_registrations", [] {
    nb::dict out;
    for (const std::string& name : ffi_targets()) {
      nb::dict bundle;
      bundle["instantiate"] = nb::capsule(reinterpret_cast<void*>(&instantiate));
      bundle["initialize"] = nb::capsule(reinterpret_cast<void*>(&initialize));
      bundle["execute"] = nb::capsule(reinterpret_cast<void*>(&execute));
      out[name.c_str()] = bundle;
    }
    nb::dict network;
    network["prepare"] = nb::capsule(reinterpret_cast<void*>(&network::prepare));
    network["execute"] = nb::capsule(reinterpret_cast<void*>(&network::execute));
    out[kNetworkTarget] = network;
    return out;
  }, "FFI target name -> {stage: capsule}, for jax.ffi.register_ffi_target(platform='CUDA').");

  m.def("cuda_exchange_offers",
        [](int64_t callsite, int32_t group, std::vector<int32_t> processes, uint64_t fingerprint, int32_t protocol,
           int32_t most_blocks, std::vector<int32_t> ranks, std::vector<std::string> buses, double timeout_s) {
          cuda::SlotOffer offer;
          offer.fingerprint = fingerprint;
          offer.protocol = protocol;
          offer.most_blocks = most_blocks;
          offer.ranks = std::move(ranks);
          offer.slots.assign(offer.ranks.size(), cuda::IpcHandle{});
          offer.buses = std::move(buses);
          std::unique_ptr<cuda::SlotExchange> x;
          Status st;
          {
            nb::gil_scoped_release release;
            st = cuda::SlotExchange::exchange(callsite, group, processes, offer, timeout_s, x);
          }
          if (!st.ok()) throw std::runtime_error(st.message());
          return x->blocks();
        },
        nb::arg("callsite"), nb::arg("group"), nb::arg("processes"), nb::arg("fingerprint"), nb::arg("protocol"),
        nb::arg("most_blocks"), nb::arg("ranks"), nb::arg("buses"), nb::arg("timeout_s"),
        "The exchange a CUDA group spanning processes runs at setup (csrc/cuda/slot_exchange.hpp), with empty slot "
        "handles: publish this process's offer, gather and check its peers'; returns the agreed blocks per lane. "
        "For tests: its checks run before any CUDA call, so they run without a GPU (the last step, registering the "
        "error record with CUDA, then fails naming the driver).");

  m.def("network_steps", [] {
    std::string why;
    const bool ok = network::available(&why);
    return std::make_tuple(ok, why);
  }, "(available, why not): whether this module was built with XLA's FFI collectives extension, which the "
     "network steps of collectives across GPU hosts need.");

  m.def("cuda_device_count", [] {
    std::string why;
    const int n = cuda::device_count(&why);
    return std::make_tuple(n, why);
  }, "(visible CUDA devices, why none) without raising: (0, reason) where there is no driver or no GPU.");

  m.def("cuda_plan_info", [](Words words, int64_t input_elements, int64_t output_elements, const std::string& dtype) {
    Plan plan;
    if (Status st = decode_plan(std::span<const int32_t>(words.data(), words.shape(0)), plan); !st.ok())
      throw nb::value_error(("malformed jaxcoll plan: " + st.message()).c_str());
    cuda::PlanImage im;
    if (Status st = cuda::build_plan_image(plan, im); !st.ok()) throw nb::value_error(st.message().c_str());
    nb::dict d;
    d["ll_ok"] = im.ll_ok;
    d["ll_reason"] = im.ll_reason;
    d["max_lanes"] = im.max_lanes;
    int meetings = 0;
    for (const cuda::DeviceLane& l : im.lanes) meetings += l.nsyncs;
    d["lane_meetings"] = meetings;
    if (input_elements > 0) {
      const auto dt = dtype_from_name(dtype);
      if (!dt) throw nb::value_error(("unsupported dtype " + dtype).c_str());
      cuda::CallShape shape;
      shape.dtype = *dt;
      shape.input_elements = input_elements;
      shape.output_elements = output_elements;
      nb::dict blocks;
      blocks["ll"] = cuda::wanted_blocks_per_lane(im, shape, cuda::Protocol::kLL);
      blocks["bulk"] = cuda::wanted_blocks_per_lane(im, shape, cuda::Protocol::kBulk);
      d["blocks_per_lane"] = blocks;
    }
    return d;
  }, nb::arg("words"), nb::arg("input_elements") = 0, nb::arg("output_elements") = 0, nb::arg("dtype") = "float32",
     "How the CUDA executor lays out a plan (no GPU needed): packet-protocol eligibility and why not, lanes, "
     "meetings between a lane's blocks; given a call's elements, the blocks per lane each protocol would take "
     "before the device's residency caps them.");

  m.def("cuda_emulate",
        [](Words words, std::vector<Bytes> inputs, std::vector<Bytes> outputs, const std::string& dtype,
           int64_t input_elements, int64_t output_elements, int reduce_op, double timeout_s,
           const std::string& protocol, int blocks_per_lane, int device, int calls,
           std::vector<int64_t> input_offsets, std::vector<int64_t> output_offsets, bool staged) {
          auto g = emulated_group(words, dtype, input_elements, output_elements, reduce_op, timeout_s, protocol,
                                  blocks_per_lane, device, std::move(input_offsets), std::move(output_offsets),
                                  staged);
          std::vector<const void*> in;
          std::vector<void*> out;
          for (Bytes& b : inputs) in.push_back(b.data());
          for (Bytes& b : outputs) out.push_back(b.data());
          {
            nb::gil_scoped_release release;
            for (int c = 0; c < std::max(calls, 1); ++c)
              if (Status st = g->run_host(in, out); !st.ok()) {
                nb::gil_scoped_acquire acquire;
                throw std::runtime_error(st.message());
              }
          }
          return describe(*g);
        },
        nb::arg("words"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("dtype"), nb::arg("input_elements"),
        nb::arg("output_elements"), nb::arg("reduce_op"), nb::arg("timeout_s"), nb::arg("protocol") = "auto",
        nb::arg("blocks_per_lane") = 0, nb::arg("device") = 0, nb::arg("calls") = 1,
        nb::arg("input_offsets") = std::vector<int64_t>{}, nb::arg("output_offsets") = std::vector<int64_t>{},
        nb::arg("staged") = false,
        "Run a plan with every rank emulated on ONE GPU (`calls` times, same inputs) on raw byte views of "
        "host buffers; returns the protocol and blocks per lane it ran with. `input_offsets` / "
        "`output_offsets` (elements per rank, or empty) place each rank's device buffers that far past an "
        "aligned base; `staged` stages each rank's buffers in its slot (bulk protocol), as across processes.");

  m.def("cuda_time",
        [](Words words, const std::string& dtype, int64_t input_elements, int64_t output_elements, int reduce_op,
           int iters, bool graph, const std::string& protocol, int blocks_per_lane, int device, double timeout_s,
           const std::string& poll, const std::string& scope) {
          auto g = emulated_group(words, dtype, input_elements, output_elements, reduce_op, timeout_s, protocol,
                                  blocks_per_lane, device, {}, {}, false, poll, scope);
          double seconds = 0;
          {
            nb::gil_scoped_release release;
            if (Status st = g->time_calls(iters, graph, seconds); !st.ok()) {
              nb::gil_scoped_acquire acquire;
              throw std::runtime_error(st.message());
            }
          }
          nb::dict d = describe(*g);
          d["seconds_per_call"] = seconds;
          return d;
        },
        nb::arg("words"), nb::arg("dtype"), nb::arg("input_elements"), nb::arg("output_elements"),
        nb::arg("reduce_op") = 0, nb::arg("iters") = 20, nb::arg("graph") = false, nb::arg("protocol") = "auto",
        nb::arg("blocks_per_lane") = 0, nb::arg("device") = 0, nb::arg("timeout_s") = 60.0, nb::arg("poll") = "",
        nb::arg("scope") = "",
        "Time emulated calls of a plan on one GPU (device buffers): seconds per call, protocol, blocks per lane "
        "and the bytes each call reads and writes. `poll` ('in_flight', 'in_order') and `scope` ('narrowest', "
        "'system') pick the kernel's variants; '' takes the default (JAXCOLL_CUDA_POLL, JAXCOLL_CUDA_SCOPE).");

  m.def("cuda_memcpy_bandwidth",
        [](size_t bytes, int iters, int device) {
          double bw = 0;
          Status st;
          {
            nb::gil_scoped_release release;
            st = cuda::memcpy_bandwidth(device, bytes, iters, bw);
          }
          if (!st.ok()) throw std::runtime_error(st.message());
          return bw;
        },
        nb::arg("bytes"), nb::arg("iters") = 10, nb::arg("device") = 0,
        "Device-to-device cudaMemcpy bandwidth (bytes copied per second, best of `iters`).");
}

}  // namespace jaxcoll::xla_cuda
