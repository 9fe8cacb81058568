"""Emitting one jaxcoll collective as a `stablehlo.custom_call` (the contract is docs/plan-ir.md, "The custom
call"): target `jaxcoll_<collective>`, operands (x, rank, group), result the rank's output, attributes `plan`
(the plan's int32 words), `reduce_op` (s32), `callsite` (s64) and `processes` (int32: the jax process hosting
each rank of each group, empty when the mesh is in one process).

`callsite` is unique per lowered call site in this process: the runtime keys its rendezvous by (callsite,
group), so collectives that XLA runs in different orders on different devices never meet the wrong peers. The
primitives register their lowerings as uncacheable: jax otherwise lowers equal equations (same primitive,
parameters and shapes) once and calls that function from every site, so two call sites would share a key.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from jax.extend.core import Primitive
from jax.extend.mlir import ir

from jaxcoll import _jax
from jaxcoll.lowering import call_plan, groups
from jaxcoll.lowering.lowered_value import LoweredValue
from jaxcoll.observe import sites
from jaxcoll.plan import Collective, encode
from jaxcoll.plan.abi import REDUCE_OP_CODES, target_name

_callsites = itertools.count(1)  # next() on itertools.count is atomic under the GIL

# A group of one rank is the identity and lowers to no custom call. Tests set this to lower it through the
# runtime anyway, so a one-device mesh exercises registration, the handler and the executor end to end.
lower_single_rank_groups = False


def next_callsite() -> int:
    return next(_callsites)


def _row_major(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim - 1, -1, -1))


class CollectivePrimitive(Primitive):
    """A primitive that lowers to the jaxcoll custom call. The first bind in a process (tracing a jaxcoll
    collective: the runtime's first use) prepares what compiling and running the call needs, so the lowering rule
    only emits IR: XLA must know the custom call's targets before it compiles the program, so it registers them
    (by importing the runtime); in a job of several processes it publishes this process's part of the job, which
    peers read when they lower a collective across processes (jaxcoll.distributed.publish: it waits for no peer).
    The runtime itself is set up for the job when such a call is first compiled (docs/multiprocess.md)."""

    def bind(self, *args, **params):
        if not _runtime_prepared:
            _prepare_runtime()
        return super().bind(*args, **params)


_runtime_prepared = False


def _prepare_runtime():
    global _runtime_prepared
    import jaxcoll.runtime  # noqa: F401  (importing it registers the targets)
    from jaxcoll import distributed
    try:
        distributed.publish()
    except Exception:
        # Raised again where the job is needed (distributed.layout() publishes first): a process whose collectives
        # all stay inside it needs nothing of the job, and must not fail here.
        pass
    _runtime_prepared = True


def emit(x: LoweredValue, out_shape, collective: Collective, *, axes: tuple, algorithm, op: str = "sum",
         api_name: str, axis_index_groups: tuple | None = None, **params) -> LoweredValue:
    """The custom call for `collective` on block-leading `x`, giving a value of `out_shape` (same dtype); over the
    groups `axis_index_groups` splits the axes into, where given (lowering/groups.py)."""
    ctx = x.ctx
    out_aval = x.aval.update(shape=tuple(out_shape))
    nranks = groups.lowered_group_size(ctx, axes, axis_index_groups)
    if nranks == 1 and not lower_single_rank_groups:
        return _single_rank(x, out_aval, collective, **params)

    value, aval = x.value, x.aval
    wire_aval, wire_out = aval, out_aval
    if aval.dtype == np.bool_:  # bool travels as one byte holding 0 or 1
        wire_aval, wire_out = aval.update(dtype=np.dtype(np.uint8)), out_aval.update(dtype=np.dtype(np.uint8))
        value = _jax.convert_hlo(ctx, value, aval, wire_aval)
    processes = groups.process_map(ctx, axes, axis_index_groups)
    hosts = None
    if processes is not None:
        # Groups span processes: the plan depends on the job's hosts. Only here is it known that a group spans
        # processes (the trace sees the mesh without its devices), so the lowering reads the hosts that every
        # process published at its first bind; it sets nothing up (the runtime does, when it compiles the call).
        from jaxcoll import distributed
        hosts = distributed.layout().hosts
    if hosts is not None and "cuda" in ctx.module_context.platforms and \
            _spans_hosts(processes.reshape(-1, nranks), hosts):
        # GPUs of several hosts: host-local plans and network steps on XLA's communicator (a plan's steps on the
        # CUDA executor reach one host's GPUs only).
        from jaxcoll.lowering import host_phases
        result = host_phases.emit(ctx, value, wire_aval, wire_out, collective, axes=axes, op=op,
                                  api_name=api_name, processes=processes, hosts=hosts, algorithm=algorithm,
                                  axis_index_groups=axis_index_groups, **params)
    else:
        nbytes = math.prod(aval.shape) * wire_aval.dtype.itemsize
        plan = call_plan.choose(api_name, collective, nranks, nbytes, wire_aval.dtype, algorithm,
                            processes=groups.process_layout(processes, nranks),
                            hosts=groups.host_layout(processes, hosts, nranks),
                            platform="cpu" if set(ctx.module_context.platforms) == {"cpu"} else "gpu", **params)
        rank, group = groups.rank_and_group(ctx, axes, axis_index_groups)
        result = call(ctx, value, wire_aval, wire_out, plan, rank, group, processes, op)
    if wire_out is not out_aval:
        result = _jax.convert_hlo(ctx, result, wire_out, out_aval)
    return LoweredValue(ctx, result, out_aval)


def _spans_hosts(processes_by_group: np.ndarray, hosts) -> bool:
    """Whether some group has ranks on several hosts (`hosts[p]`: the host of process p)."""
    host_of = np.asarray(hosts)[processes_by_group]
    return bool((host_of != host_of[:, :1]).any())


def call(ctx, value, aval, out_aval, plan, rank, group, processes: np.ndarray | None, op: str):
    """One jaxcoll custom call running `plan` on `value` (of `aval`, giving `out_aval`): `rank` and `group` are this
    device's s32 scalars, `processes` the process map of every group's ranks (None within one process). The op's
    location names the collective and its plan (`jaxcoll.all_reduce[two_shot, 8 ranks]`), which XLA keeps as the
    op's name: profiles (jax.profiler, TensorBoard, Perfetto) and HLO dumps say what ran."""
    where = f"jaxcoll.{plan.collective.value}[{plan.name or 'plan'}, {plan.nranks} ranks]"
    with ir.Location.name(where, childLoc=ir.Location.current):
        return _custom_call(ctx, value, aval, out_aval, plan, rank, group, processes, op)


def _custom_call(ctx, value, aval, out_aval, plan, rank, group, processes, op):
    callsite = next_callsite()
    sites.record(sites.Site(callsite, plan.collective.value, plan.name or "plan", plan.nranks))
    return _jax.custom_call(
        target_name(plan.collective),
        result_types=[_jax.aval_to_ir_type(ctx.module_context, out_aval)],
        operands=[value, rank, group],
        backend_config={
            "plan": _jax.ir_attribute(encode(plan)),
            "reduce_op": _jax.ir_attribute(np.int32(REDUCE_OP_CODES[op])),
            "callsite": _jax.ir_attribute(np.int64(callsite)),
            "processes": _jax.ir_attribute(np.zeros(0, np.int32) if processes is None else processes),
        },
        api_version=4,
        operand_layouts=[_row_major(len(aval.shape)), (), ()],
        result_layouts=[_row_major(len(out_aval.shape))],
    ).result


def _single_rank(x: LoweredValue, out_aval, collective: Collective, perm=(), **_) -> LoweredValue:
    """A group of one rank: every collective is the identity on its one block, except a ppermute that does not
    send rank 0 to itself, which gives zeros."""
    if collective is Collective.PPERMUTE and (0, 0) not in tuple(map(tuple, perm)):
        zeros = _jax.full_like_aval(x.ctx, 0, out_aval)
        return LoweredValue(x.ctx, zeros, out_aval)
    return x.reshape(out_aval.shape)
