"""Lowering a collective whose groups span GPU hosts: the phases of jaxcoll.algorithms.across_hosts, each a custom
call (docs/cuda.md, "Across hosts").

An ipc phase is an ordinary jaxcoll custom call over sub-groups of one host (its plan chosen by
`jaxcoll.algorithms.select`; its sub-groups may span the host's processes, reached through CUDA IPC); a network
phase is the `jaxcoll_network` custom call, whose replica groups are its sub-groups (the rails, or the whole group
for all_to_all, broadcast and ppermute) as XLA numbers devices (flattened ids), with the broadcast's `root` and the
ppermute's `pairs` as attributes. Each device's sub-rank and sub-group are constants of tables indexed by its
rank and group, so every device of the SPMD program still sees the same attributes.
"""

from __future__ import annotations

import math

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from jaxcoll import _jax
from jaxcoll.algorithms import across_hosts
from jaxcoll.lowering import call_plan, groups
from jaxcoll.plan import Collective
from jaxcoll.plan.abi import NETWORK_TARGET, REDUCE_OP_CODES
from jaxcoll.plan.ir import COLLECTIVE_CODES, default_blocks


def check_network_steps(api_name: str) -> None:
    """RuntimeError, at trace time, where the network steps cannot run: a module built without CUDA, or against
    a jaxlib whose FFI has no collectives extension."""
    from jaxcoll import runtime
    native = runtime._jaxcoll
    if not getattr(native, "with_cuda", False):
        raise RuntimeError(f"{api_name}: this group spans GPU hosts, but jaxcoll was built without the CUDA executor")
    ok, why = native.network_steps()
    if not ok:
        raise RuntimeError(f"{api_name}: this group spans GPU hosts, and jaxcoll cannot run its network steps: {why}")


def schedules(processes: np.ndarray, hosts, nranks: int, collective: Collective, api_name: str, **params):
    """The schedule of every group (same phases in all: one custom call serves every group of a phase); `params`
    are the collective's root or perm."""
    out = []
    for g in range(len(processes) // nranks):
        host_of_rank = [hosts[int(p)] for p in processes[g * nranks:(g + 1) * nranks]]
        try:
            out.append(across_hosts.schedule(collective, host_of_rank, **params))
        except ValueError as e:
            raise ValueError(f"{api_name}: {e}") from e
    shapes = {tuple((p.transport, len(p.groups), len(p.groups[0])) for p in s.phases) for s in out}
    if len(shapes) != 1:
        layouts = sorted({(len(s.hosts), len(s.hosts[0])) for s in out})
        raise ValueError(f"{api_name}: the groups of this call span different numbers of hosts or GPUs per host "
                         f"({layouts} as (hosts, GPUs per host)); jaxcoll needs one layout for every group")
    return out


def emit(ctx, value, aval, out_aval, collective: Collective, *, axes: tuple, op: str, api_name: str,
         processes: np.ndarray, hosts, algorithm="auto", root: int = 0, perm=(), axis_index_groups=None):
    """The phases of `collective` on block-leading `value` (wire dtype), giving `out_aval`; `root` and `perm` are a
    broadcast's and a ppermute's parameters, `axis_index_groups` lax's (lowering/groups.py)."""
    from jaxcoll.lowering import custom_call
    if algorithm != "auto":
        raise ValueError(f"{api_name}: algorithm={algorithm!r} names one plan for the whole group, but the group "
                         "spans GPU hosts, where jaxcoll runs host-local plans and network steps (algorithm='auto')")
    check_network_steps(api_name)
    nranks = groups.lowered_group_size(ctx, axes, axis_index_groups)
    plan_of = schedules(processes, hosts, nranks, collective, api_name, root=root, perm=perm)
    ngroups = len(plan_of)
    rank, group = groups.rank_and_group(ctx, axes, axis_index_groups)
    devices = groups.device_ids(ctx, axes, axis_index_groups)
    dtype = aval.dtype
    total = math.prod(aval.shape)
    flat = _jax.reshape_hlo(ctx, value, aval.update(shape=(total,)))
    per_host = len(plan_of[0].hosts[0])
    if collective is Collective.ALL_REDUCE and total % per_host:
        padded = -(-total // per_host) * per_host  # the host-local reduce_scatter splits it in per_host blocks
        zero = _jax.ir_constant(np.zeros((), dtype))
        flat = hlo.pad(flat, zero, ir.DenseI64ArrayAttr.get([0]), ir.DenseI64ArrayAttr.get([padded - total]),
                       ir.DenseI64ArrayAttr.get([0]))
    else:
        padded = total
    size = padded
    if plan_of[0].input_blocks is not None:
        flat = _permute_blocks(flat, size, [s.input_blocks for s in plan_of])
    for k, phase in enumerate(plan_of[0].phases):
        parts = len(phase.groups[0])
        in_blocks, out_blocks = default_blocks(phase.collective, parts)
        new_size = size * out_blocks // in_blocks
        in_aval, result_aval = aval.update(shape=(size,)), aval.update(shape=(new_size,))
        subgroups = [s.phases[k].groups for s in plan_of]
        if phase.transport == across_hosts.IPC:
            sub_rank, sub_group, sub_processes = _sub_tables(subgroups, processes, nranks)
            layout = groups.process_layout(sub_processes, parts)
            plan = call_plan.choose(api_name, phase.collective, parts, size * dtype.itemsize, dtype, "auto",
                                processes=layout, platform="gpu")
            flat = custom_call.call(ctx, flat, in_aval, result_aval, plan,
                                    groups.lookup(ctx, sub_rank, rank, group, nranks),
                                    groups.lookup(ctx, sub_group, rank, group, nranks),
                                    None if (sub_processes == sub_processes[0]).all() else sub_processes, op)
        else:
            ids = np.array([devices[g * nranks + r] for g, sub in enumerate(subgroups) for rail in sub for r in rail],
                           np.int64)
            flat = _network_call(ctx, flat, in_aval, result_aval, phase, op, ids)
        size = new_size
    if plan_of[0].output_blocks is not None:
        flat = _permute_blocks(flat, size, [s.output_blocks for s in plan_of])
    if padded != total:
        flat = hlo.slice(flat, ir.DenseI64ArrayAttr.get([0]), ir.DenseI64ArrayAttr.get([total]),
                         ir.DenseI64ArrayAttr.get([1]))
    return _jax.reshape_hlo(ctx, flat, out_aval)


def _sub_tables(subgroups, processes: np.ndarray, nranks: int):
    """For an ipc phase: each rank's sub-rank and sub-group ([group * nranks + rank]), and the sub-groups' process
    map ([sub_group * parts + sub_rank])."""
    nsub, parts = len(subgroups[0]), len(subgroups[0][0])
    sub_rank = np.empty(len(subgroups) * nranks, np.int32)
    sub_group = np.empty_like(sub_rank)
    sub_processes = np.empty(len(subgroups) * nsub * parts, np.int32)
    for g, sub in enumerate(subgroups):
        for k, members in enumerate(sub):
            for i, r in enumerate(members):
                sub_rank[g * nranks + r] = i
                sub_group[g * nranks + r] = g * nsub + k
                sub_processes[(g * nsub + k) * parts + i] = processes[g * nranks + r]
    return sub_rank, sub_group, sub_processes


def network_attributes(phase: across_hosts.Phase, op: str, ids: np.ndarray) -> dict:
    """The attributes of `phase`'s `jaxcoll_network` custom call (read by xla_ffi/cuda_network.cc), as numpy
    values: `groups` holds the sub-groups' flattened device ids, `group_size` ranks each; `root` (s32) and `pairs`
    (s64, source and target sub-ranks interleaved) are read by broadcast and ppermute, 0 and empty for the others."""
    return {
        "collective": np.int32(COLLECTIVE_CODES[phase.collective]),
        "reduce_op": np.int32(REDUCE_OP_CODES[op]),
        "groups": np.asarray(ids, np.int64),
        "group_size": np.int64(len(phase.groups[0])),
        "root": np.int32(phase.root),
        "pairs": np.array(phase.pairs, np.int64).reshape(-1),
    }


def _network_call(ctx, value, aval, out_aval, phase: across_hosts.Phase, op: str, ids: np.ndarray):
    return _jax.custom_call(
        NETWORK_TARGET,
        result_types=[_jax.aval_to_ir_type(ctx.module_context, out_aval)],
        operands=[value],
        backend_config={name: _jax.ir_attribute(v) for name, v in network_attributes(phase, op, ids).items()},
        api_version=4,
        operand_layouts=[(0,)],
        result_layouts=[(0,)],
    ).result


def _permute_blocks(flat, size: int, orders):
    """Rearrange the equal blocks of a 1-D value: block i of the result is block order[i]. The order is the same
    in every group (the rail decomposition depends on the ranks' hosts only through their positions), checked."""
    if any(o != orders[0] for o in orders):
        raise ValueError("jaxcoll across hosts: the groups of this call place their ranks on hosts differently; "
                         "one custom call cannot rearrange their blocks alike")
    order = orders[0]
    if list(order) == sorted(order):
        return flat
    nblocks = len(order)
    block = size // nblocks
    pieces = [hlo.slice(flat, ir.DenseI64ArrayAttr.get([b * block]), ir.DenseI64ArrayAttr.get([(b + 1) * block]),
                        ir.DenseI64ArrayAttr.get([1])) for b in order]
    return hlo.concatenate(pieces, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0))
