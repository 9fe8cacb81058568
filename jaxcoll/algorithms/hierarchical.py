"""Hierarchical plans for a group whose ranks live in several processes (docs/multiprocess.md): within each
process first, then across processes through what every process shares anyway, then within again, as NCCL's
intra-node / inter-node split does.

Across processes a rank's scratch is always in shared memory, but its input and output are XLA's, private to its
process: a step of another process that names them makes the runtime copy those chunks in (inputs, at entry) or
out (outputs, after the call) (csrc/cross_process.hpp). These plans keep every cross-process step on scratch, or on
inputs only, so the copies the runtime adds are the fewest:

- all_reduce: rank (p, l), the l-th of its process's L ranks, reduces chunk l of its process's inputs into its
  scratch, signals the ranks of the same l in the other processes, then reduces chunk l of every process's
  scratch, in process order, into the outputs of its own process's ranks. No input or output chunk is reached
  from another process; 2S + (P+1)S/L bytes per rank, each chunk reduced once (identical bits everywhere).
- reduce_scatter: rank (p, l) reduces, for each other process q, block (q, l) of its process's inputs into
  scratch and signals its owner; then reduces its own block over its process's inputs and every other process's
  partial. No input or output is reached from another process.
- all_gather: each chunk of another process crosses into this process once: the process's ranks share the
  pulls, then copy each other's pulled chunks within the process. Only inputs are reached from other processes
  (copied in once, or sent once over the network), never outputs (which direct plans would write remotely).
- all_to_all pulls: each rank gets its peers' input chunks for it into its own output (every chunk is distinct,
  so nothing would be saved by relaying).

`processes[r]` names the process of rank r (any labels); all_reduce and reduce_scatter need the same number of
ranks in every process.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step

IN, OUT, SCRATCH = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH


def _layout(processes: Sequence[int]) -> tuple[list[list[int]], list[int], list[int]]:
    """(ranks of each process in order of first appearance, process position of each rank, local index of each
    rank)."""
    order: dict[int, int] = {}
    members: list[list[int]] = []
    where, local = [], []
    for r, p in enumerate(processes):
        if p not in order:
            order[p] = len(members)
            members.append([])
        where.append(order[p])
        local.append(len(members[order[p]]))
        members[order[p]].append(r)
    return members, where, local


def uniform(processes: Sequence[int]) -> bool:
    """Whether every process holds the same number of the group's ranks (what all_reduce and reduce_scatter
    need)."""
    members, _, _ = _layout(processes)
    return len({len(m) for m in members}) == 1


def _check_uniform(processes: Sequence[int], collective: str) -> None:
    if not uniform(processes):
        members, _, _ = _layout(processes)
        raise ValueError(f"hierarchical {collective} needs the same number of ranks in every process, got "
                         f"processes={tuple(processes)} ({[len(m) for m in members]} ranks per process)")


def all_reduce(processes: Sequence[int]) -> Plan:
    _check_uniform(processes, "all_reduce")
    members, where, local = _layout(processes)
    n, nproc, per = len(processes), len(members), len(members[0])
    programs = []
    for r in range(n):
        p, l = where[r], local[r]
        mine = members[p]
        partial = Step(Op.READ_REDUCE if per > 1 else Op.COPY, tuple(ChunkRef(q, IN, l) for q in mine),
                       (ChunkRef(r, SCRATCH, l),))
        peers = [members[o][l] for o in range(nproc) if o != p]
        signals = tuple(Step(Op.SIGNAL, peer=q, sem=0) for q in peers)
        waits = tuple(Step(Op.WAIT, sem=0) for _ in peers)
        total = Step(Op.READ_REDUCE_PUT if nproc > 1 or per > 1 else Op.COPY,
                     tuple(ChunkRef(members[o][l], SCRATCH, l) for o in range(nproc)),
                     tuple(ChunkRef(q, OUT, l) for q in mine))
        programs.append(RankProgram(per, per, scratch_chunks=per, semaphores=1 if peers else 0,
                                    lanes=(Lane((partial, *signals, *waits, total)),)))
    return Plan(Collective.ALL_REDUCE, n, tuple(programs), name="hierarchical")


def reduce_scatter(processes: Sequence[int]) -> Plan:
    _check_uniform(processes, "reduce_scatter")
    members, where, local = _layout(processes)
    n, nproc = len(processes), len(members)
    programs = []
    for r in range(n):
        p, l = where[r], local[r]
        mine = members[p]
        steps = []
        # Partials for the ranks of local index l elsewhere: scratch chunk o holds process p's part of block
        # (o, l).
        for o in range(nproc):
            if o == p:
                continue
            owner = members[o][l]
            steps.append(Step(Op.READ_REDUCE if len(mine) > 1 else Op.COPY,
                              tuple(ChunkRef(q, IN, owner) for q in mine), (ChunkRef(r, SCRATCH, o),)))
            steps.append(Step(Op.SIGNAL, peer=owner, sem=0))
        steps += [Step(Op.WAIT, sem=0) for _ in range(nproc - 1)]
        # This rank's block: its process's inputs, then every other process's partial, in process order.
        srcs = []
        for o in range(nproc):
            srcs += [ChunkRef(q, IN, r) for q in mine] if o == p else [ChunkRef(members[o][l], SCRATCH, p)]
        steps.append(Step(Op.READ_REDUCE if len(srcs) > 1 else Op.COPY, tuple(srcs), (ChunkRef(r, OUT, 0),)))
        programs.append(RankProgram(n, 1, scratch_chunks=nproc, semaphores=1 if nproc > 1 else 0,
                                    lanes=(Lane(tuple(steps)),)))
    return Plan(Collective.REDUCE_SCATTER, n, tuple(programs), name="hierarchical")


def all_gather(processes: Sequence[int]) -> Plan:
    members, where, local = _layout(processes)
    n = len(processes)
    programs = []
    for r in range(n):
        p, l = where[r], local[r]
        mine = members[p]
        # Every chunk of another process crosses once into this process: rank (p, l) pulls the remote chunks
        # dealt to local index l, then its process's other ranks copy them from its output. Pulling every chunk
        # into every rank would carry each one L times (over a network, L times the bytes on the wire).
        remote = [q for q in range(n) if where[q] != p]
        dealt = {q: mine[i % len(mine)] for i, q in enumerate(remote)}
        pulls = [Step(Op.GET, (ChunkRef(q, IN, 0),), (ChunkRef(r, OUT, q),)) for q in remote if dealt[q] == r]
        relays = [q for q in mine if q != r and any(dealt[o] == q for o in remote)]
        receivers = [q for q in mine if q != r] if pulls else []
        steps = [*pulls, *(Step(Op.SIGNAL, peer=q, sem=0) for q in receivers)]
        steps += [Step(Op.COPY, (ChunkRef(q, IN, 0),), (ChunkRef(r, OUT, q),)) for q in mine]
        steps += [Step(Op.WAIT, sem=0) for _ in relays]
        steps += [Step(Op.COPY, (ChunkRef(dealt[q], OUT, q),), (ChunkRef(r, OUT, q),)) for q in remote
                  if dealt[q] != r]
        programs.append(RankProgram(1, n, semaphores=1 if relays or receivers else 0, lanes=(Lane(tuple(steps)),)))
    return Plan(Collective.ALL_GATHER, n, tuple(programs), name="hierarchical")


def all_to_all(processes: Sequence[int]) -> Plan:
    n = len(processes)
    programs = [RankProgram(n, n, lanes=(Lane(tuple(
        Step(Op.GET if q != r else Op.COPY, (ChunkRef(q, IN, r),), (ChunkRef(r, OUT, q),)) for q in range(n))),))
        for r in range(n)]
    return Plan(Collective.ALL_TO_ALL, n, tuple(programs), name="hierarchical")
