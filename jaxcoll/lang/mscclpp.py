"""Export a plan as an MSCCL++ JSON execution plan (the file the MSCCL++ executor loads).

A lane becomes a threadblock and a step an operation. MSCCL++ reaches peers through *memory channels*, each
pairing two gpus (the i-th channel of a towards b meets the i-th of b towards a) with one semaphore, and names
remote memory through *remote buffers*. The export gives each pair of gpus one memory channel for each of the
plan's channels that carries data between them (`Step.channel`, in increasing order; a step naming none uses
channel 0), then one per *signal source* between them, in sorted order.

A plan semaphore counts signals from anyone; an MSCCL++ `wait` names the channels it waits on (one thread per
channel, each consuming one signal of that channel's semaphore). A semaphore signalled by one gpu maps onto one
channel (source `(gpu, -1, sem)`), which counts alike. A semaphore signalled by several gpus ("every peer
signals, then wait for all of them", `sem=`) gets a channel per signalling lane (source `(gpu, lane, sem)`), so
each channel's signals come in that lane's order, and the export proves which signals each run of consecutive
waits consumes: the checker's happens-before relation (`jaxcoll.lang.check.happens_before`) says which signals
are sure to have arrived when the run ends; when those number at least the waits so far, the run waits on
exactly them (earliest first), one `wait` op listing their channels; otherwise which signal a wait takes is not
fixed by the plan and the export is a PlanError naming the wait. Signals between lanes of one gpu become device
semaphores (sem_release / sem_acquire), chosen the same way. A zero step has no MSCCL++ operation (PlanError).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict

from jaxcoll.lang.check import happens_before, schedule, where
from jaxcoll.plan.collectives import TABLE
from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.ir import Buffer, Op, Plan
from jaxcoll.plan.validate import validate

NAMES = {c: d.mscclpp for c, d in TABLE.items()}  # the execution plan's "collective"
LETTER = {Buffer.INPUT: "i", Buffer.OUTPUT: "o", Buffer.SCRATCH: "s"}
OPS = {Op.COPY: "copy", Op.PUT: "put", Op.GET: "get", Op.REDUCE: "re", Op.READ_REDUCE: "rrc",
       Op.REDUCE_PUT: "rs", Op.READ_REDUCE_PUT: "rrcs"}


Node = tuple[int, int, int]  # (rank, lane, step position)
Source = tuple[int, int, int]  # (signalling rank, its lane or -1 for any of its lanes, semaphore)
MAX_CHANNELS_PER_OP = 8  # MSCCL++ MAX_CHANNEL_PER_OPERATION (src/core/include/execution_common.hpp)
MAX_SEMAPHORES_PER_OP = 16  # MSCCL++ MAX_DEVICE_SEMAPHORES


def signal_sources(plan: Plan) -> dict[Node, Source]:
    """The source each signal step is sent from: one per signalling gpu of a semaphore that only one gpu
    signals, one per signalling lane otherwise."""
    ranks: dict[tuple[int, int], set[int]] = defaultdict(set)  # (waiter, sem) -> signalling ranks
    for r, _, _, step in plan.steps():
        if step.op is Op.SIGNAL:
            ranks[step.peer, step.sem].add(r)
    return {(r, l, i): (r, -1 if len(ranks[step.peer, step.sem]) == 1 else l, step.sem)
            for r, l, i, step in plan.steps() if step.op is Op.SIGNAL}


def wait_sources(plan: Plan, source: dict[Node, Source]) -> dict[Node, list[Source]]:
    """For every wait step, the sources whose signals its MSCCL++ wait consumes, one entry per signal.

    One signalling gpu: each wait consumes one signal of its one source. Several: the first wait of each run of
    consecutive waits on the semaphore consumes, for the whole run, the signals the checker proves have arrived
    when the run ends that earlier runs did not take (earliest first); the run's other waits consume nothing.
    Raises PlanError naming the wait when fewer signals are sure to have arrived than the waits so far consume."""
    signals: dict[tuple[int, int], list[Node]] = defaultdict(list)  # (waiter, sem) -> signal steps
    for r, l, i, step in plan.steps():
        if step.op is Op.SIGNAL:
            signals[step.peer, step.sem].append((r, l, i))
    consumed: dict[Node, list[Source]] = {}
    shared = {key for key, sigs in signals.items() if len({source[x] for x in sigs}) > 1}
    for r, l, i, step in plan.steps():
        if step.op is Op.WAIT and (r, step.sem) not in shared:
            sigs = signals.get((r, step.sem))
            if not sigs:
                raise PlanError(f"{where(plan, (r, l, i))}: no step signals semaphore {step.sem} of rank {r}; "
                                f"expected a signal for every wait")
            consumed[r, l, i] = [source[sigs[0]]]
    if not shared:
        return consumed
    order = schedule(plan)
    pos = {node: p for p, node in enumerate(order)}
    hb = happens_before(plan, order)
    for w, sem in sorted(shared):
        waits = [(w, l, i) for l, lane in enumerate(plan.ranks[w].lanes) for i, step in enumerate(lane.steps)
                 if step.op is Op.WAIT and step.sem == sem]
        if len({l for _, l, _ in waits}) > 1:
            other = next(x for x in waits if x[1] != waits[0][1])
            raise PlanError(f"{where(plan, other)}: semaphore {sem} of rank {w} is waited on by several lanes "
                            f"(also {where(plan, waits[0])}); expected one waiting lane")
        taken: set[Node] = set()
        runs: list[list[Node]] = []
        for node in waits:
            if runs and runs[-1][-1][2] + 1 == node[2]:
                runs[-1].append(node)
            else:
                runs.append([node])
        done = 0
        for run in runs:
            done += len(run)
            last = run[-1]
            sure = [x for x in signals[w, sem] if (hb[last] >> pos[x]) & 1]
            if len(sure) < done:
                got = ", ".join(where(plan, x) for x in sure) or "none"
                raise PlanError(
                    f"{where(plan, run[0])}: which signals on semaphore {sem} of rank {w} this wait consumes is not "
                    f"fixed: {done} waits up to {where(plan, last)} but only {len(sure)} signals are sure to have "
                    f"arrived there (from: {got}), so its signals race with later waits' and an MSCCL++ wait must "
                    f"name its channels; expected the waits for signals of unordered ranks in one run of waits")
            fresh = sorted((x for x in sure if x not in taken), key=pos.__getitem__)[:done - len(taken)]
            taken.update(fresh)
            consumed[run[0]] = sorted(source[x] for x in fresh)
            consumed.update((node, []) for node in run[1:])
    return consumed


def rounds(ids: list[int], limit: int) -> list[list[int]]:
    """`ids` (with repeats) as operations of at most `limit` distinct ids each: a channel or semaphore appears
    once per operation, since each id is waited on by one thread."""
    left = Counter(ids)
    out = []
    while left:
        batch = sorted(left)[:limit]
        out.append(batch)
        left.subtract(batch)
        left = +left
    return out


def to_mscclpp_json(plan: Plan, *, indent: int | None = 1) -> str:
    """The plan as MSCCL++ execution-plan JSON text. Raises PlanError for a zero step, a wait nothing signals,
    and a wait on a semaphore several gpus signal whose signals the plan does not fix (module docstring)."""
    validate(plan)
    source = signal_sources(plan)
    consumed = wait_sources(plan, source)
    # channel slots per unordered pair: ("data", channel) in increasing channel order, then the signal sources
    # between the two in sorted order; both ends list them alike
    data: dict[tuple[int, int], set[int]] = defaultdict(set)
    for r, _, _, step in plan.steps():
        if step.op.is_data:
            for ref in step.srcs + step.dsts:
                if ref.rank != r:
                    data[min(r, ref.rank), max(r, ref.rank)].add(max(step.channel, 0))
    slots: dict[tuple[int, int], list] = defaultdict(list)
    for key, chans in sorted(data.items()):
        slots[key] = [("data", c) for c in sorted(chans)]
    sources: dict[tuple[int, int], set[Source]] = defaultdict(set)
    for (r, l, i), src in source.items():
        peer = plan.ranks[r].lanes[l].steps[i].peer
        if peer != r:
            sources[min(r, peer), max(r, peer)].add(src)
    for key, srcs in sorted(sources.items()):
        slots[key] += sorted(srcs)
    gpus = []
    for g, prog in enumerate(plan.ranks):
        peers = sorted({b if a == g else a for a, b in slots if g in (a, b)})
        channel_id, connected = {}, []
        for p in peers:
            for slot in slots[min(g, p), max(g, p)]:
                channel_id[p, slot] = len(connected)
                connected.append(p)
        remote, remote_id = [], {}

        def buff(ref, channels, chan=0):
            if ref.rank == g:
                return {"type": LETTER[ref.buffer], "index": ref.index, "size": ref.count}
            key = (ref.rank, ref.buffer)
            if key not in remote_id:
                remote_id[key] = len(remote)
                remote.append({"rank": ref.rank, "type": LETTER[ref.buffer], "access_channel_types": ["memory"]})
            channels.append(channel_id[ref.rank, ("data", chan)])
            return {"buffer_id": remote_id[key], "index": ref.index, "size": ref.count}

        tbs = []
        local_sem: dict[Source, int] = {}
        for l, lane in enumerate(prog.lanes):
            ops = []
            for i, step in enumerate(lane.steps):
                if step.op is Op.SIGNAL and step.peer == g:  # between lanes of a rank: a device semaphore
                    src = source[g, l, i]
                    ops.append({"name": "sem_release", "semaphore_ids": [local_sem.setdefault(src, len(local_sem))]})
                elif step.op is Op.SIGNAL:
                    ops.append({"name": "signal", "channel_type": "memory",
                                "channel_ids": [channel_id[step.peer, source[g, l, i]]]})
                elif step.op is Op.WAIT:
                    srcs = consumed[g, l, i]
                    local = [local_sem.setdefault(src, len(local_sem)) for src in srcs if src[0] == g]
                    waited = [channel_id[src[0], src] for src in srcs if src[0] != g]
                    for ids in rounds(local, MAX_SEMAPHORES_PER_OP):
                        ops.append({"name": "sem_acquire", "semaphore_ids": ids})
                    for ids in rounds(waited, MAX_CHANNELS_PER_OP):
                        ops.append({"name": "wait", "channel_type": "memory", "channel_ids": ids})
                elif step.op is Op.BARRIER:
                    ops.append({"name": "barrier", "barrier_id": 0, "num_threadblocks": len(prog.lanes)})
                elif step.op is Op.ZERO:
                    raise PlanError(f"{where(plan, (g, l, i))}: a zero step has no MSCCL++ operation")
                else:
                    channels: list[int] = []
                    local_dsts = [d for d in step.dsts if d.rank == g]
                    remote_dsts = [d for d in step.dsts if d.rank != g]
                    chan = max(step.channel, 0)
                    srcs = [buff(s, channels, chan) for s in step.srcs]
                    name = OPS[step.op]
                    if step.op in (Op.PUT, Op.COPY, Op.GET) and local_dsts and remote_dsts:
                        ops.append({"name": "copy", "src_buff": srcs, "dst_buff": [buff(d, []) for d in local_dsts]})
                        dsts = [buff(d, channels, chan) for d in remote_dsts]
                    else:
                        dsts = [buff(d, channels, chan) for d in step.dsts]
                    op = {"name": name, "src_buff": srcs, "dst_buff": dsts}
                    if channels:
                        op.update(channel_type="memory", channel_ids=channels)
                    ops.append(op)
            tbs.append({"id": l, "ops": ops,
                        "channels": [{"channel_type": "memory", "channel_ids": list(range(len(connected)))}],
                        "remote_buffer_refs": [{"access_channel_type": "memory",
                                                "remote_buffer_ids": list(range(len(remote)))}]})
        gpus.append({"id": g, "input_chunks": prog.input_chunks, "output_chunks": prog.output_chunks,
                     "scratch_chunks": prog.scratch_chunks,
                     "channels": [{"channel_type": "memory", "connected_to": connected}] if connected else [],
                     "remote_buffers": remote, "semaphores": [{"init_value": 0} for _ in local_sem], "threadblocks": tbs})
    doc = {"name": plan.name or plan.collective.value, "collective": NAMES[plan.collective],
           "protocol": "LL" if plan.protocol == "ll" else "Simple", "inplace": plan.in_place,
           "reuse_resources": False, "use_double_scratch_buffer": False, "buffer_alignment": 16,
           "num_threads_per_block": 1024, "min_message_size": 0, "max_message_size": 2 ** 64 - 1,
           "gpus": gpus}
    return json.dumps(doc, indent=indent)
