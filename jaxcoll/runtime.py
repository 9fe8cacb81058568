"""The bridge to jaxcoll's native runtime (csrc/, xla_ffi/): loads the extension, registers its XLA FFI targets
for the CPU platform (and XLA's CUDA platform when the module was built with CUDA), and runs plans on the real
executors without JAX: `run_plan` (CPU threads) and `run_plan_cuda` (every rank emulated on one GPU).

Importing this module registers the targets (idempotent); the first bind of a jaxcoll primitive imports it
(lowering/custom_call.py, `CollectivePrimitive`), before the program that calls it compiles. The targets
(`jaxcoll.plan.abi.TARGETS`) and their operands and attributes are specified in docs/plan-ir.md.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

try:
    from jaxcoll import _jaxcoll
except ImportError as e:  # pragma: no cover - depends on how jaxcoll was installed
    raise ImportError(
        "jaxcoll's native module jaxcoll._jaxcoll is not built. Install the package (`pip install .`) or, in a "
        "checkout, build it in place with `tools/build_inplace.sh`.") from e


def _check_jaxlib() -> None:
    # The FFI C API is versioned: a module built against another jaxlib's headers may be refused by XLA, or
    # misread its call frames. Say so at import, naming both versions, instead.
    import jaxlib.version
    running = jaxlib.version.__version__
    built = getattr(_jaxcoll, "jaxlib_version", "an unrecorded version (a module older than the check)")
    if running != built:
        raise ImportError(
            f"jaxcoll's native module was built against jaxlib {built}, but jaxlib {running} is running. Rebuild "
            f"jaxcoll with the jaxlib it runs with: `python -m pip install -e .` again in its checkout, or "
            f"`tools/build_inplace.sh` for a PYTHONPATH checkout.")


_check_jaxlib()
# A malformed JAXCOLL_* setting is an error here, naming the variable and its value, before any call runs (the
# runtime reads its settings once; csrc/env.hpp, docs/runtime.md "Settings").
_jaxcoll.check_environment()

from jaxcoll.plan import Plan, encode
from jaxcoll.plan.abi import REDUCE_OP_CODES

STATE_TYPE = "jaxcoll.plan_state"
DEFAULT_TIMEOUT_S = 300.0

_registered = False
_lock = threading.Lock()


def register() -> None:
    """Register jaxcoll's FFI state type and targets with XLA for platform "cpu" (once per process)."""
    global _registered
    with _lock:
        if _registered:
            return
        import jax.ffi
        _register_state_type()
        for name, bundle in _jaxcoll.registrations().items():
            jax.ffi.register_ffi_target(name, bundle, platform="cpu", api_version=1)
        # The sparse all-reduce's local stages: stateless, XLA:CPU only (other platforms take sparse.py's jnp path).
        for name, handler in _jaxcoll.sparse_registrations().items():
            jax.ffi.register_ffi_target(name, handler, platform="cpu", api_version=1)
        # The codec of the quantized collectives (jaxcoll.compress.codec): stateless kernels, CPU only.
        for name, handler in _jaxcoll.codec_registrations().items():
            jax.ffi.register_ffi_target(name, handler, platform="cpu", api_version=1)
        if _jaxcoll.with_cuda:
            # The same target names on XLA's CUDA platform: XLA resolves a custom call by (name, platform), so
            # the lowering stays one rule. Registration is deferred by jaxlib until a CUDA backend exists, and
            # the handler keeps no FFI state type, so no type has to be registered before it.
            for name, bundle in _jaxcoll.cuda_registrations().items():
                jax.ffi.register_ffi_target(name, bundle, platform="CUDA", api_version=1)
        _registered = True


def _register_state_type() -> None:
    # Before the CPU backend exists jax.ffi.register_ffi_type would defer it into a replay that XLA rejects;
    # jaxcoll._jax.register_ffi_type works around it.
    from jaxcoll import _jax
    _jax.register_ffi_type(STATE_TYPE, _jaxcoll.state_type(), platform="cpu")


def call_stats(reset: bool = False) -> list[dict]:
    """The runtime's record of each call site that ran (jaxcoll.observe.stats names and summarises it)."""
    return list(_jaxcoll.call_stats(bool(reset)))


def communicator_memory() -> tuple[int, int]:
    """(communicators, bytes): the live communicators of the groups inside this process, and the scratch and
    staging bytes they hold between calls (read it between calls). A compiled call site holds its own, and frees
    them when XLA drops its last executable (the function is dropped, or `jax.clear_caches()`)."""
    communicators, held = _jaxcoll.communicator_memory()
    return int(communicators), int(held)


def default_timeout_s() -> float:
    """The timeout of a call in seconds, as the runtime reads it: JAXCOLL_TIMEOUT, default 300."""
    return float(_jaxcoll.default_timeout_s())


def configure_world(process: int, pids: Sequence[int], hosts: Sequence[int], token: str,
                    host_names: Sequence[str] = ()) -> None:
    """Tell the native runtime which job this process is part of (jaxcoll.distributed.connect does it);
    `host_names[p]` names process p's host in messages."""
    _jaxcoll.configure_world(int(process), [int(p) for p in pids], [int(h) for h in hosts], str(token),
                             [str(h) for h in host_names])


def set_world_set_up(set_up) -> None:
    """Register `set_up()` (jaxcoll.distributed.connect) as the step the native runtime runs, once, before the
    first call whose group spans processes needs the job: when XLA instantiates that call (it compiles the
    program). An exception it raises fails that compilation with its message."""
    def step() -> str:
        try:
            set_up()
        except Exception as e:  # crosses into C++ as a message, and back to the user as XLA's compile error
            return str(e)
        return ""
    _jaxcoll.set_world_set_up(step)


def open_presence(token: str, process: int) -> str:
    """Create this process's presence segment (a nonce, locked while the process lives: csrc/shared_memory.hpp);
    returns the nonce."""
    return str(_jaxcoll.open_presence(str(token), int(process)))


def read_presence(token: str, process: int) -> str:
    """The nonce in process `process`'s presence as this process sees it; "" when it sees none (another
    /dev/shm)."""
    return str(_jaxcoll.read_presence(str(token), int(process)))


def net_listen(process: int, address: str, port: int, token: str) -> int:
    """Listen for the job's network peers at `address` ("" or "0.0.0.0": every interface) on `port` (0: a free
    one); returns the port taken."""
    return int(_jaxcoll.net_listen(int(process), str(address), int(port), str(token)))


def net_connect(peers: Sequence[int], addresses: Sequence[str], ports: Sequence[int], timeout_s: float) -> None:
    """Connect to the job's processes on other hosts (addresses and ports indexed by process)."""
    _jaxcoll.net_connect([int(p) for p in peers], [str(a) for a in addresses], [int(p) for p in ports],
                         float(timeout_s))


def check_words(words: np.ndarray) -> None:
    """Decode serialized plan words exactly as the executor does; raise ValueError naming the fault."""
    _jaxcoll.check_plan(np.ascontiguousarray(words, dtype=np.int32).ravel())


def _rank_inputs(inputs: Sequence[np.ndarray], api: str):
    """Contiguous copies of one input per rank, all of one shape and dtype: (inputs, dtype, shape)."""
    if not inputs:
        raise ValueError(f"{api}: needs one input per rank, got none")
    inputs = [np.ascontiguousarray(x) for x in inputs]
    dtype, shape = inputs[0].dtype, inputs[0].shape
    for r, x in enumerate(inputs):
        if x.dtype != dtype or x.shape != shape:
            raise ValueError(f"{api}: input {r} is {x.dtype}{list(x.shape)}, input 0 is {dtype}{list(shape)}; "
                             "every rank passes the same shape and dtype")
    return inputs, dtype, shape


def run_words(words: np.ndarray, inputs: Sequence[np.ndarray], output_shape: Sequence[int], reduce_op: int = 0,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> list[np.ndarray]:
    """Run serialized plan words on the C++ executor, one thread per rank, without JAX.

    `inputs[r]` is rank r's input (all of one shape and dtype); every rank's output has `output_shape`.
    Raises ValueError for a malformed plan or mismatched buffers and RuntimeError when execution fails (a
    timeout names the collective, the ranks that never arrived or the semaphore never signalled).
    """
    words = np.ascontiguousarray(words, dtype=np.int32).ravel()
    inputs, dtype, shape = _rank_inputs(inputs, "run_words")
    outputs = [np.empty(tuple(output_shape), dtype) for _ in inputs]
    _jaxcoll.run_plan(words, [x.reshape(-1).view(np.uint8) for x in inputs],
                      [y.reshape(-1).view(np.uint8) for y in outputs], dtype.name,
                      int(np.prod(shape, dtype=np.int64)), int(np.prod(output_shape, dtype=np.int64)),
                      int(reduce_op), float(timeout_s))
    return outputs


def output_shape(plan: Plan, input_shape: Sequence[int]) -> tuple[int, ...]:
    """A rank's output shape for an input of `input_shape`: the leading axis scales by out_blocks/in_blocks
    (all_gather multiplies it by N, reduce_scatter divides it); a 0-d input stays as it is."""
    input_shape = tuple(input_shape)
    if plan.in_blocks == plan.out_blocks:
        return input_shape
    n = int(np.prod(input_shape, dtype=np.int64))
    if n % plan.in_blocks:
        raise ValueError(f"an input of shape {input_shape} ({n} elements) does not split into the plan's "
                         f"in_blocks={plan.in_blocks} blocks")
    if input_shape and (input_shape[0] * plan.out_blocks) % plan.in_blocks == 0:
        return (input_shape[0] * plan.out_blocks // plan.in_blocks,) + input_shape[1:]
    return (n // plan.in_blocks * plan.out_blocks,)


def run_plan(plan: Plan, inputs: Sequence[np.ndarray], op: str = "sum",
             timeout_s: float = DEFAULT_TIMEOUT_S) -> list[np.ndarray]:
    """Run `plan` on the real CPU executor, one thread per rank, in this process and without JAX.

    `inputs[r]` is rank r's input; returns each rank's output. The output shape follows from the plan's
    in_blocks/out_blocks (see `output_shape`). `op` is "sum", "max" or "min".
    """
    if op not in REDUCE_OP_CODES:
        raise ValueError(f"run_plan: op must be one of {list(REDUCE_OP_CODES)}, got {op!r}")
    if len(inputs) != plan.nranks:
        raise ValueError(f"run_plan: the plan has {plan.nranks} ranks but got {len(inputs)} inputs")
    expect = getattr(plan, "expect", None)
    if expect is not None and expect.reduce_op != "sum" and op != expect.reduce_op:
        # A plan proved for max or min may reduce a contribution twice, which only those ops forgive.
        raise ValueError(f"run_plan: the plan's postcondition is stated for op={expect.reduce_op!r} (it may "
                         f"reduce a contribution more than once), so it cannot run with op={op!r}")
    shape = output_shape(plan, np.shape(inputs[0]))
    return run_words(encode(plan), inputs, shape, REDUCE_OP_CODES[op], timeout_s)


def cuda_status() -> tuple[bool, str]:
    """(usable, why not): whether the CUDA executor can run here. Never raises: a module built without CUDA, a
    machine without a driver and a machine without a GPU each give False and a reason."""
    if not getattr(_jaxcoll, "with_cuda", False):
        return False, "jaxcoll was built without the CUDA executor (no CUDA toolkit, or -DJAXCOLL_CUDA=OFF)"
    count, why = _jaxcoll.cuda_device_count()
    if count == 0:
        return False, f"no usable CUDA device: {why}"
    return True, ""


# Thread blocks per lane at most: a semaphore is one counter per block of the signalling lane
# (kMaxBlocksPerLane, csrc/cuda/kernel_params.hpp).
MAX_BLOCKS_PER_LANE = 32


def run_words_cuda(words: np.ndarray, inputs: Sequence[np.ndarray], output_shape: Sequence[int],
                   reduce_op: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S, protocol: str = "auto",
                   blocks_per_lane: int = 0, calls: int = 1, device: int = 0,
                   input_offsets: Sequence[int] | None = None,
                   output_offsets: Sequence[int] | None = None,
                   staged: bool = False) -> tuple[list[np.ndarray], dict]:
    """`run_words` on the CUDA executor with every rank emulated on ONE GPU (`device`): the group's slots share
    the device and one launch holds every rank's thread blocks. `protocol` is "auto", "ll" or "bulk";
    `calls` > 1 runs the call repeatedly on the same group (its counters advance as under XLA). Returns the
    outputs and {"protocol", "blocks_per_lane", "traffic_bytes"} of the run. RuntimeError names a failing
    step (a timeout reports the rank, lane, step and semaphore).

    `input_offsets` / `output_offsets` (one count of elements per rank, default all 0) start each rank's
    device buffers that many elements past an aligned base: the unaligned addresses XLA's sliced buffers may
    have, and peers whose addresses no one vector peel aligns.

    `staged` runs the bulk protocol as a group spanning processes does (docs/cuda.md, "Groups across
    processes"): each rank's buffers copied into its slot around the kernel, peers reaching them by offsets."""
    words = np.ascontiguousarray(words, dtype=np.int32).ravel()
    inputs, dtype, shape = _rank_inputs(inputs, "run_words_cuda")
    if (not isinstance(blocks_per_lane, (int, np.integer)) or isinstance(blocks_per_lane, bool)
            or not 0 <= blocks_per_lane <= MAX_BLOCKS_PER_LANE):
        raise ValueError(f"run_words_cuda: blocks_per_lane must be 0 (the executor chooses) or "
                         f"1..{MAX_BLOCKS_PER_LANE}, got {blocks_per_lane!r}")
    offsets = {name: _rank_offsets(value, len(inputs), name)
               for name, value in (("input_offsets", input_offsets), ("output_offsets", output_offsets))}
    outputs = [np.empty(tuple(output_shape), dtype) for _ in inputs]
    info = _jaxcoll.cuda_emulate(words, [x.reshape(-1).view(np.uint8) for x in inputs],
                                 [y.reshape(-1).view(np.uint8) for y in outputs], dtype.name,
                                 int(np.prod(shape, dtype=np.int64)), int(np.prod(output_shape, dtype=np.int64)),
                                 int(reduce_op), float(timeout_s), protocol, int(blocks_per_lane), int(device),
                                 int(calls), **offsets, staged=bool(staged))
    return outputs, dict(info)


def _rank_offsets(offsets: Sequence[int] | None, nranks: int, name: str) -> list[int]:
    """One element offset >= 0 per rank (None: none), checked before the harness allocates."""
    if offsets is None:
        return []
    offsets = list(offsets)
    if len(offsets) != nranks or not all(isinstance(o, (int, np.integer)) and o >= 0 for o in offsets):
        raise ValueError(f"run_words_cuda: {name} must be one whole number >= 0 per rank ({nranks}), "
                         f"got {offsets!r}")
    return [int(o) for o in offsets]


def run_plan_cuda(plan: Plan, inputs: Sequence[np.ndarray], op: str = "sum", timeout_s: float = DEFAULT_TIMEOUT_S,
                  protocol: str = "auto", blocks_per_lane: int = 0, calls: int = 1) -> list[np.ndarray]:
    """`run_plan` on the CUDA executor, every rank emulated on one GPU (see `run_words_cuda`)."""
    if op not in REDUCE_OP_CODES:
        raise ValueError(f"run_plan_cuda: op must be one of {list(REDUCE_OP_CODES)}, got {op!r}")
    if len(inputs) != plan.nranks:
        raise ValueError(f"run_plan_cuda: the plan has {plan.nranks} ranks but got {len(inputs)} inputs")
    shape = output_shape(plan, np.shape(inputs[0]))
    outs, _ = run_words_cuda(encode(plan), inputs, shape, REDUCE_OP_CODES[op], timeout_s, protocol, blocks_per_lane,
                             calls)
    return outs


register()
