"""Export a plan as an MSCCL++ JSON execution plan (the file the MSCCL++ executor loads).

A lane becomes a threadblock and a step an operation. MSCCL++ reaches peers through *memory channels*, each
pairing two gpus (the i-th channel of a towards b meets the i-th of b towards a) with one semaphore, and names
remote memory through *remote buffers*. The export gives each pair of gpus one memory channel for each of the
plan's channels that carries data between them (`Step.channel`, in increasing order; a step naming none uses
channel 0), then one per (signalling gpu, semaphore) used between them, so a wait consumes exactly the signals
of the semaphore it names.

Limits: a semaphore signalled by several gpus has no MSCCL++ equivalent (a wait names one channel, so one peer),
nor has a zero step; both raise PlanError. Signals between lanes of one gpu become device semaphores
(sem_release / sem_acquire).
"""

from __future__ import annotations

import json
from collections import defaultdict

from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.ir import Buffer, Collective, Op, Plan
from jaxcoll.plan.validate import validate

NAMES = {Collective.ALL_REDUCE: "allreduce", Collective.ALL_GATHER: "allgather",
         Collective.REDUCE_SCATTER: "reducescatter", Collective.ALL_TO_ALL: "alltoall",
         Collective.BROADCAST: "broadcast", Collective.PPERMUTE: "sendrecv", Collective.CUSTOM: "custom"}
LETTER = {Buffer.INPUT: "i", Buffer.OUTPUT: "o", Buffer.SCRATCH: "s"}
OPS = {Op.COPY: "copy", Op.PUT: "put", Op.GET: "get", Op.REDUCE: "re", Op.READ_REDUCE: "rrc",
       Op.REDUCE_PUT: "rs", Op.READ_REDUCE_PUT: "rrcs"}


def to_mscclpp_json(plan: Plan, *, indent: int | None = 1) -> str:
    """The plan as MSCCL++ execution-plan JSON text."""
    validate(plan)
    n = plan.nranks
    signallers: dict[tuple[int, int], set[int]] = defaultdict(set)  # (waiter, sem) -> signalling ranks
    for r, _, _, step in plan.steps():
        if step.op is Op.SIGNAL:
            signallers[step.peer, step.sem].add(r)
    for (w, sem), who in signallers.items():
        if len(who) > 1:
            raise PlanError(f"rank {w} semaphore {sem} is signalled by ranks {sorted(who)}; an MSCCL++ wait "
                            f"names one channel, so one signalling peer")
    # channel slots per unordered pair: ("data", channel) in increasing channel order, then (signaller, sem) in
    # sorted order; both ends list them alike
    data: dict[tuple[int, int], set[int]] = defaultdict(set)
    for r, _, _, step in plan.steps():
        if step.op.is_data:
            for ref in step.srcs + step.dsts:
                if ref.rank != r:
                    data[min(r, ref.rank), max(r, ref.rank)].add(max(step.channel, 0))
    slots: dict[tuple[int, int], list] = defaultdict(list)
    for key, chans in sorted(data.items()):
        slots[key] = [("data", c) for c in sorted(chans)]
    for (w, sem), who in sorted(signallers.items()):
        for s in sorted(who):
            if s != w:
                key = (min(s, w), max(s, w))
                if (s, sem) not in slots[key]:
                    slots[key].append((s, sem))
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
        local_sem: dict[int, int] = {}
        for l, lane in enumerate(prog.lanes):
            ops = []
            for i, step in enumerate(lane.steps):
                where = f"rank {g}, lane {l}, step {i} ({step!r})"
                if step.op is Op.SIGNAL and step.peer == g:  # between lanes of a rank: a device semaphore
                    ops.append({"name": "sem_release", "semaphore_ids": [local_sem.setdefault(step.sem,
                                                                                            len(local_sem))]})
                elif step.op is Op.SIGNAL:
                    ops.append({"name": "signal", "channel_type": "memory",
                                "channel_ids": [channel_id[step.peer, (g, step.sem)]]})
                elif step.op is Op.WAIT:
                    who = signallers.get((g, step.sem), set())
                    if not who:
                        raise PlanError(f"{where}: no step signals this semaphore")
                    (s,) = who
                    if s == g:
                        ops.append({"name": "sem_acquire", "semaphore_ids": [local_sem.setdefault(step.sem,
                                                                                                len(local_sem))]})
                        continue
                    ops.append({"name": "wait", "channel_type": "memory",
                                "channel_ids": [channel_id[s, (s, step.sem)]]})
                elif step.op is Op.BARRIER:
                    ops.append({"name": "barrier", "barrier_id": 0, "num_threadblocks": len(prog.lanes)})
                elif step.op is Op.ZERO:
                    raise PlanError(f"{where}: a zero step has no MSCCL++ operation")
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
