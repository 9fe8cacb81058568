"""The bridge to jaxcoll's native runtime (csrc/, xla_ffi/): loads the extension, registers its XLA FFI targets
for the CPU platform, and runs plans on the real executor without JAX (`run_plan`).

Importing this module registers the targets (idempotent); the lowering imports it before emitting a custom
call. The targets (`TARGETS`) and their operands and attributes are specified in docs/plan-ir.md.
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

from jaxcoll.plan import Plan, encode
from jaxcoll.plan.ir import Collective

TARGETS = ("jaxcoll_all_reduce", "jaxcoll_all_gather", "jaxcoll_reduce_scatter", "jaxcoll_all_to_all",
           "jaxcoll_broadcast", "jaxcoll_ppermute", "jaxcoll_custom")
REDUCE_OPS = {"sum": 0, "max": 1, "min": 2}
STATE_TYPE = "jaxcoll.plan_state"
DEFAULT_TIMEOUT_S = 300.0

_registered = False
_lock = threading.Lock()


def target_name(collective: Collective | str) -> str:
    """The FFI target of a plan's collective: "jaxcoll_" + its name."""
    return "jaxcoll_" + Collective(collective).value


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
        _registered = True


def _register_state_type() -> None:
    # jaxlib replays deferred registrations in the wrong order when the CPU backend starts (FFI targets before
    # FFI types, which XLA rejects), so before the backend exists the type goes straight into XLA's
    # process-wide FFI registry; afterwards the public API registers it at once.
    import jax.ffi
    from jaxlib import xla_client
    deferred = "cpu" not in getattr(xla_client, "_custom_type_id_handler", {"cpu": None})
    direct = getattr(getattr(xla_client, "_xla", None), "register_custom_type", None)
    if deferred and direct is not None:
        direct(STATE_TYPE, _jaxcoll.state_type())
    else:
        jax.ffi.register_ffi_type(STATE_TYPE, _jaxcoll.state_type(), platform="cpu")


def check_words(words: np.ndarray) -> None:
    """Decode serialized plan words exactly as the executor does; raise ValueError naming the fault."""
    _jaxcoll.check_plan(np.ascontiguousarray(words, dtype=np.int32).ravel())


def run_words(words: np.ndarray, inputs: Sequence[np.ndarray], output_shape: Sequence[int], reduce_op: int = 0,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> list[np.ndarray]:
    """Run serialized plan words on the C++ executor, one thread per rank, without JAX.

    `inputs[r]` is rank r's input (all of one shape and dtype); every rank's output has `output_shape`.
    Raises ValueError for a malformed plan or mismatched buffers and RuntimeError when execution fails (a
    timeout names the collective, the ranks that never arrived or the semaphore never signalled).
    """
    words = np.ascontiguousarray(words, dtype=np.int32).ravel()
    if not inputs:
        raise ValueError("run_words: needs one input per rank, got none")
    inputs = [np.ascontiguousarray(x) for x in inputs]
    dtype, shape = inputs[0].dtype, inputs[0].shape
    for r, x in enumerate(inputs):
        if x.dtype != dtype or x.shape != shape:
            raise ValueError(f"run_words: input {r} is {x.dtype}{list(x.shape)}, input 0 is {dtype}{list(shape)}; "
                             "every rank passes the same shape and dtype")
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
    if op not in REDUCE_OPS:
        raise ValueError(f"run_plan: op must be one of {sorted(REDUCE_OPS)}, got {op!r}")
    if len(inputs) != plan.nranks:
        raise ValueError(f"run_plan: the plan has {plan.nranks} ranks but got {len(inputs)} inputs")
    expect = getattr(plan, "expect", None)
    if expect is not None and expect.reduce_op != "sum" and op != expect.reduce_op:
        # A plan proved for max or min may reduce a contribution twice, which only those ops forgive.
        raise ValueError(f"run_plan: the plan's postcondition is stated for op={expect.reduce_op!r} (it may "
                         f"reduce a contribution more than once), so it cannot run with op={op!r}")
    shape = output_shape(plan, np.shape(inputs[0]))
    return run_words(encode(plan), inputs, shape, REDUCE_OPS[op], timeout_s)


register()
