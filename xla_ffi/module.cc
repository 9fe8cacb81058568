// jaxcoll._jaxcoll: the native module. It hands the FFI handler and its state type to jaxcoll.runtime (which
// registers them with XLA), and exposes the executor directly, without JAX, for the planning side and tests.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "csrc/abi.hpp"
#include "csrc/call_stats.hpp"
#include "csrc/collectives.hpp"
#include "csrc/communicator.hpp"
#include "csrc/env.hpp"
#include "csrc/executor.hpp"
#include "csrc/layout.hpp"
#include "csrc/local_group.hpp"
#include "csrc/net.hpp"
#include "csrc/plan.hpp"
#include "csrc/shared_memory.hpp"
#include "csrc/cross_process.hpp"
#include "csrc/topk.hpp"
#include "csrc/trace.hpp"
#include "csrc/trace_steps.hpp"
#include "csrc/world.hpp"
#include "xla_ffi/codec_handlers.hpp"
#include "xla_ffi/handler.hpp"
#include "xla_ffi/sparse.hpp"
#ifdef JAXCOLL_WITH_CUDA
#include "xla_ffi/cuda_module.hpp"
#endif

namespace nb = nanobind;

namespace {

using Words = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Bytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::capsule capsule(XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); }
nb::capsule capsule(const void* p) { return nb::capsule(const_cast<void*>(p)); }

jaxcoll::Plan decode_or_throw(const Words& words) {
  jaxcoll::Plan plan;
  jaxcoll::Status st = jaxcoll::decode_plan(std::span<const int32_t>(words.data(), words.shape(0)), plan);
  if (!st.ok()) throw nb::value_error(("malformed jaxcoll plan: " + st.message()).c_str());
  return plan;
}

}  // namespace

NB_MODULE(_jaxcoll, m) {
  m.doc() = "jaxcoll's native runtime: the XLA FFI handlers, the CPU executor and (when built with CUDA) the CUDA one.";
#ifdef JAXCOLL_WITH_CUDA
  m.attr("with_cuda") = true;
  jaxcoll::xla_cuda::add_bindings(m);
#else
  m.attr("with_cuda") = false;
#endif
  // The jaxlib whose FFI headers this module was compiled against (CMakeLists.txt); jaxcoll.runtime compares it
  // with the running jaxlib.
  m.attr("jaxlib_version") = JAXCOLL_JAXLIB_VERSION;

  m.def("registrations", [] {
    nb::dict out;
    for (const std::string& name : jaxcoll::ffi_targets()) {
      nb::dict bundle;
      bundle["instantiate"] = capsule(jaxcoll::xla_cpu::instantiate);
      bundle["execute"] = capsule(jaxcoll::xla_cpu::execute);
      out[name.c_str()] = bundle;
    }
    return out;
  }, "FFI target name -> {stage: capsule}, for jax.ffi.register_ffi_target(platform='cpu').");

  m.def("sparse_registrations", [] {
    nb::dict out;
    for (const auto& [name, handler] : jaxcoll::xla_cpu::sparse_handlers()) out[name] = capsule(handler);
    return out;
  }, "The sparse all-reduce's FFI target name -> execute capsule, for jax.ffi.register_ffi_target(platform='cpu').");

  m.def("codec_registrations", [] {
    nb::dict out;
    out[jaxcoll::kCodecEncodeTarget] = capsule(JaxcollCodecEncode);
    out[jaxcoll::kCodecDecodeTarget] = capsule(JaxcollCodecDecode);
    out[jaxcoll::kCodecDecodeSumTarget] = capsule(JaxcollCodecDecodeSum);
    out[jaxcoll::kCodecDecodeSumEncodeTarget] = capsule(JaxcollCodecDecodeSumEncode);
    out[jaxcoll::kCodecEncodeWireTarget] = capsule(JaxcollCodecEncodeWire);
    out[jaxcoll::kCodecDecodeSumWireTarget] = capsule(JaxcollCodecDecodeSumWire);
    out[jaxcoll::kCodecDecodeSumEncodeWireTarget] = capsule(JaxcollCodecDecodeSumEncodeWire);
    out[jaxcoll::kCodecDecodeWireTarget] = capsule(JaxcollCodecDecodeWire);
    return out;
  }, "The codec's FFI target name -> handler capsule (stateless), for jax.ffi.register_ffi_target(platform='cpu').");

  m.def("abi", [] {
    nb::dict reduce_ops;
    for (int32_t code = 0; code < jaxcoll::kNumReduceOps; ++code) reduce_ops[jaxcoll::kReduceOpNames[code]] = code;
    nb::list targets;
    for (const std::string& name : jaxcoll::ffi_targets()) targets.append(name.c_str());
    nb::dict out;
    out["reduce_ops"] = reduce_ops;
    out["targets"] = targets;
    out["network_target"] = jaxcoll::kNetworkTarget;
    nb::list sparse_targets;
    for (const char* name : jaxcoll::kSparseTargets) sparse_targets.append(name);
    out["sparse_targets"] = sparse_targets;
    nb::dict topk;  // the constants jaxcoll.compress.sparse's jnp stages share with csrc/topk.hpp
    topk["sample"] = jaxcoll::kTopkSample;
    topk["sample_run"] = jaxcoll::kTopkSampleRun;
    topk["stripe"] = jaxcoll::kTopkStripe;
    topk["no_entry"] = jaxcoll::kNoEntry;
    out["topk"] = topk;

    nb::list codec_targets;
    for (const char* name : jaxcoll::kCodecTargets) codec_targets.append(name);
    out["codec_targets"] = codec_targets;

    // csrc/collectives.hpp, in the order of the codes; block counts for groups of 1 .. 16 ranks.
    nb::list collectives;
    for (const jaxcoll::CollectiveInfo& c : jaxcoll::kCollectives) {
      nb::dict d;
      d["name"] = c.name;
      d["code"] = static_cast<int32_t>(c.collective);
      d["in_place"] = jaxcoll::kInPlaceNames[static_cast<size_t>(c.in_place)];
      d["reduces"] = c.reduces;
      d["plan_states"] = c.plan_states;
      nb::list blocks;
      for (int32_t n = 1; n <= 16; ++n) blocks.append(nb::make_tuple(c.in_blocks(n), c.out_blocks(n)));
      d["blocks"] = blocks;
      collectives.append(d);
    }
    out["collectives"] = collectives;
    return out;
  }, "The custom call's interface as compiled in (csrc/abi.hpp, csrc/collectives.hpp): reduction name -> code, the "
     "FFI targets, and each collective's table entry.");

  m.def("state_type", [] {
    nb::dict out;
    out["type_id"] = capsule(jaxcoll::xla_cpu::state_type_id());
    out["type_info"] = capsule(jaxcoll::xla_cpu::state_type_info());
    return out;
  }, "The FFI state type of decoded plans, for jax.ffi.register_ffi_type.");

  m.def("check_plan", [](Words words) { decode_or_throw(words); }, nb::arg("words"),
        "Decode and structurally validate plan words as the executor does; raise ValueError if malformed.");

  m.def("chunk_range", [](int64_t k, int64_t block, int64_t index, int64_t count) {
    const jaxcoll::ElementRange r = jaxcoll::chunk_range(k, block, index, count);
    return std::make_tuple(r.start, r.stop);
  }, nb::arg("k"), nb::arg("block"), nb::arg("index"), nb::arg("count") = 1,
        "Element range [start, stop) of chunks index..index+count-1 (csrc/layout.hpp).");

  m.def("check_environment", [] {
    if (const std::string& error = jaxcoll::env_settings().error; !error.empty()) throw nb::value_error(error.c_str());
  }, "Raise ValueError naming every malformed JAXCOLL_* variable the runtime reads (csrc/env.hpp).");

  m.def("call_stats", [](bool reset) {
    nb::list out;
    for (const jaxcoll::CallStats& s : jaxcoll::call_stats(reset)) {
      nb::dict d;
      d["callsite"] = s.callsite;
      d["calls"] = s.calls;
      d["bytes"] = s.bytes;
      d["min_s"] = s.min_s;
      d["max_s"] = s.max_s;
      d["recent_s"] = s.recent;
      out.append(d);
    }
    return out;
  }, nb::arg("reset") = false,
        "Each call site that ran on the CPU runtime: its calls, one rank's input bytes, the fastest and slowest call "
        "and the last calls' seconds (jaxcoll.stats); `reset` forgets them after reading.");

  m.def("communicator_memory", [] {
    const jaxcoll::CommunicatorMemory m = jaxcoll::communicator_memory();
    return std::make_tuple(m.communicators, m.bytes);
  }, "(communicators, bytes): the live communicators of groups inside this process and the scratch and staging "
     "bytes they hold between calls (a compiled call site's, freed with its last executable).");
  m.def("open_tracer", &jaxcoll::open_tracer, "Trace the steps of every call that starts from now (jaxcoll.trace).");
  m.def("close_tracer", &jaxcoll::close_tracer, "Close one open_tracer: tracing stops when none is open.");
  m.def("trace_clock_ns", [] {
    const int64_t monotonic = jaxcoll::trace_now_ns();
    const int64_t realtime = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::system_clock::now().time_since_epoch()).count();
    return std::make_tuple(monotonic, realtime);
  }, "(monotonic, realtime) nanoseconds now: the events' clock and the wall clock, read together.");
  m.def("trace_events", [](bool clear) {
    uint64_t dropped = 0;
    const std::vector<jaxcoll::TraceEvent> events = jaxcoll::trace_events(clear, dropped);
    return std::make_tuple(nb::bytes(reinterpret_cast<const char*>(events.data()),
                                     events.size() * sizeof(jaxcoll::TraceEvent)),
                           dropped);
  }, nb::arg("clear") = false,
        "(events, dropped): every traced step so far as packed csrc/trace.hpp TraceEvents, and how many were "
        "overwritten in full buffers; `clear` forgets them.");
  m.def("trace_device_steps",
        [](Words words, nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> times,
           const std::string& dtype_name, int64_t block, int32_t first_rank, int32_t launch_ranks,
           int64_t clock_offset_ns, int64_t read_ns, int64_t callsite, int32_t group, int64_t call) {
          jaxcoll::Plan plan;
          if (jaxcoll::Status st = jaxcoll::decode_plan(std::span<const int32_t>(words.data(), words.shape(0)), plan);
              !st.ok())
            throw nb::value_error(("malformed jaxcoll plan: " + st.message()).c_str());
          const auto dtype = jaxcoll::dtype_from_name(dtype_name);
          if (!dtype) throw nb::value_error(("unsupported dtype " + dtype_name).c_str());
          if (int64_t(times.shape(0)) != 2 * jaxcoll::device_trace_slots(plan))
            throw nb::value_error("times must hold two uint64 for each step of the plan");
          const jaxcoll::StepSizes sizes{plan.chunk_factor, block, jaxcoll::dtype_size(*dtype),
                                         jaxcoll::accum_size(*dtype)};
          const jaxcoll::DeviceCall dc{callsite, call, group, first_rank, launch_ranks, clock_offset_ns, read_ns};
          const std::vector<jaxcoll::TraceEvent> events = jaxcoll::device_step_events(plan, sizes, dc, times.data());
          return nb::bytes(reinterpret_cast<const char*>(events.data()), events.size() * sizeof(jaxcoll::TraceEvent));
        },
        nb::arg("words"), nb::arg("times"), nb::arg("dtype"), nb::arg("block"), nb::arg("first_rank"),
        nb::arg("launch_ranks"), nb::arg("clock_offset_ns"), nb::arg("read_ns"), nb::arg("callsite") = -1,
        nb::arg("group") = 0, nb::arg("call") = 0,
        "The trace events the CUDA executor records for one call from its kernel's step times (csrc/trace_steps.hpp:"
        " two uint64 a step, %globaltimer ns, 0 where not reached), as packed TraceEvents; no GPU needed.");
  m.def("trace_globaltimer_offset_ns", &jaxcoll::globaltimer_offset_ns,
        "The offset the CUDA executor subtracts from %globaltimer to put GPU steps on the events' clock.");
  m.def("trace_event_size", [] { return sizeof(jaxcoll::TraceEvent); },
        "Bytes of one event of trace_events (jaxcoll/observe/trace_events.py's EVENT reads them).");

  m.def("default_timeout_s", &jaxcoll::default_timeout_s,
        "The timeout of a call in seconds: JAXCOLL_TIMEOUT, default 300 (read once).");

  m.def("configure_world",
        [](int32_t process, std::vector<int64_t> pids, std::vector<int32_t> hosts, std::string token,
           std::vector<std::string> host_names) {
          jaxcoll::Status st = jaxcoll::configure_world(process, std::move(pids), std::move(hosts), std::move(token),
                                                        std::move(host_names));
          if (!st.ok()) throw std::runtime_error(st.message());
        },
        nb::arg("process"), nb::arg("pids"), nb::arg("hosts"), nb::arg("token"),
        nb::arg("host_names") = std::vector<std::string>(),
        "Tell the runtime which job this process belongs to (jaxcoll.distributed.connect does it once).");

  m.def("set_world_set_up",
        [](nb::callable set_up) {
          // Never freed: the runtime may run it from XLA's threads until the process exits, and a Python object
          // must not be released after the interpreter has gone.
          auto* step = new nb::callable(std::move(set_up));
          jaxcoll::set_world_set_up([step]() -> jaxcoll::Status {
            nb::gil_scoped_acquire gil;
            try {
              const std::string error = nb::cast<std::string>((*step)());
              return error.empty() ? jaxcoll::Status{} : jaxcoll::Status::Error(error);
            } catch (const std::exception& e) {
              return jaxcoll::Status::Error(std::string("jaxcoll: setting up the job's runtime failed: ") + e.what());
            }
          });
        },
        nb::arg("set_up"),
        "Register the step that sets the job's runtime up (a callable returning \"\" or an error message); the "
        "runtime runs it once, when it instantiates the first call whose group spans processes.");

  m.def("open_presence",
        [](std::string token, int32_t process) {
          std::string nonce;
          jaxcoll::Status st = jaxcoll::open_presence(token, process, nonce);
          if (!st.ok()) throw std::runtime_error(st.message());
          return nonce;
        },
        nb::arg("token"), nb::arg("process"),
        "Create this process's presence segment (locked while it lives); returns the nonce in it.");
  m.def("read_presence", &jaxcoll::read_presence, nb::arg("token"), nb::arg("process"),
        "The nonce in another process's presence as this process sees it (\"\": none, another /dev/shm).");
  m.def("clean_stale_segments", &jaxcoll::clean_stale_segments,
        "Unlink the segments of jaxcoll processes that no longer live; returns how many (tests).");

  m.def("net_listen",
        [](int32_t process, std::string address, int port, std::string token) {
          // The handler before the port: a peer may connect and send as soon as the port is open.
          jaxcoll::serve_network();
          int bound = 0;
          jaxcoll::Status st = jaxcoll::net_listen(process, address, port, token, bound);
          if (!st.ok()) throw std::runtime_error(st.message());
          return bound;
        },
        nb::arg("process"), nb::arg("address"), nb::arg("port"), nb::arg("token"),
        "Listen for the job's network peers at an address (\"\": every one) and port (0: a free one); returns the "
        "port.");

  m.def("net_connect",
        [](std::vector<int32_t> peers, std::vector<std::string> addresses, std::vector<int> ports, double timeout_s) {
          jaxcoll::Status st;
          {
            nb::gil_scoped_release release;
            st = jaxcoll::net_connect(peers, addresses, ports, timeout_s);
          }
          if (!st.ok()) throw std::runtime_error(st.message());
        },
        nb::arg("peers"), nb::arg("addresses"), nb::arg("ports"), nb::arg("timeout_s"),
        "Connect to the job's processes on other hosts (addresses and ports indexed by process).");

  m.def("net_refused", &jaxcoll::net_refused, "Connections refused for a wrong token (tests).");

  m.def("solo_bytes", &jaxcoll::solo_bytes, "Bytes a call reads and writes in all (every rank together) up to which one thread runs it.");
  m.def("set_solo_bytes", &jaxcoll::set_solo_bytes, nb::arg("bytes"),
        "Set the solo threshold (tuning and tests; JAXCOLL_SOLO_BYTES sets it at load).");

  m.def("run_plan",
        [](Words words, std::vector<Bytes> inputs, std::vector<Bytes> outputs, const std::string& dtype_name,
           int64_t input_elements, int64_t output_elements, int reduce_op, double timeout_s) {
          const jaxcoll::Plan plan = decode_or_throw(words);
          const auto dtype = jaxcoll::dtype_from_name(dtype_name);
          if (!dtype) throw nb::value_error(("run_plan: unsupported dtype " + dtype_name).c_str());
          const auto op = jaxcoll::reduce_op_from_code(reduce_op);
          if (!op)
            throw nb::value_error(("run_plan: reduce_op must be " + jaxcoll::reduce_op_codes() + ", got " +
                                   std::to_string(reduce_op)).c_str());
          if (!(timeout_s > 0)) throw nb::value_error("run_plan: timeout_s must be positive");
          const size_t esize = jaxcoll::dtype_size(*dtype);
          std::vector<const void*> in;
          std::vector<void*> out;
          for (size_t r = 0; r < inputs.size(); ++r) {
            if (inputs[r].shape(0) != size_t(input_elements) * esize)
              throw nb::value_error(("run_plan: input " + std::to_string(r) + " has " +
                                     std::to_string(inputs[r].shape(0)) + " bytes, expected " +
                                     std::to_string(input_elements * esize)).c_str());
            in.push_back(inputs[r].data());
          }
          for (size_t r = 0; r < outputs.size(); ++r) {
            if (outputs[r].shape(0) != size_t(output_elements) * esize)
              throw nb::value_error(("run_plan: output " + std::to_string(r) + " has " +
                                     std::to_string(outputs[r].shape(0)) + " bytes, expected " +
                                     std::to_string(output_elements * esize)).c_str());
            out.push_back(outputs[r].data());
          }
          jaxcoll::Status st;
          {
            nb::gil_scoped_release release;
            st = jaxcoll::run_local_group(plan, in, out, input_elements, output_elements, *dtype, *op,
                                          timeout_s);
          }
          if (!st.ok()) throw std::runtime_error(st.message());
        },
        nb::arg("words"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("dtype"), nb::arg("input_elements"),
        nb::arg("output_elements"), nb::arg("reduce_op"), nb::arg("timeout_s"),
        "Run a plan on one thread per rank, in process and without JAX, on raw byte views of the buffers.");
}
