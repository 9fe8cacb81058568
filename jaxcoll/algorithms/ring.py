"""Ring schedules: each chunk travels the ring 0 -> 1 -> ... -> N-1 -> 0, one hop per step, so every link
carries (N-1)/N of the data per phase. Bandwidth-optimal on a ring of equal links and the classic choice where
peers are reached only through neighbours; on shared memory it costs N-1 synchronisations per phase.

Each rank runs one lane; one semaphore counts the "chunk ready" signals from its left neighbour. Puts and waits
happen in the same order on both sides of a link, so counting suffices.
"""

from __future__ import annotations

from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step

IN, OUT, SCR = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH


def _reduce_scatter_steps(r: int, n: int, final: callable) -> list[Step]:
    """Ring reduce-scatter as seen from rank r: chunk c is reduced along c+1, c+2, ..., c, partial sums in the
    accumulation-typed scratch, and its last hop's result is written to `final(c)` (a tuple of dsts)."""
    right = (r + 1) % n
    steps = []
    for j in range(n):  # at time j, rank r is the (j+1)-th rank on chunk c's path
        c = (r - 1 - j) % n
        if j > 0:
            steps.append(Step(Op.WAIT, sem=0))
        if j == 0:
            srcs = (ChunkRef(r, IN, c),)
        else:
            srcs = (ChunkRef(r, SCR, c), ChunkRef(r, IN, c))
        if j < n - 1:
            steps.append(Step(Op.REDUCE_PUT if j else Op.PUT, srcs, (ChunkRef(right, SCR, c),)))
            steps.append(Step(Op.SIGNAL, peer=right, sem=0))
        else:
            steps.append(Step(Op.REDUCE_PUT if any(d.rank != r for d in final(c)) else Op.READ_REDUCE, srcs, final(c)))
    return steps


def _all_gather_steps(r: int, n: int, start: int) -> list[Step]:
    """Ring all-gather from rank r's view, after rank c holds its chunk c in its output: N-1 forwards."""
    right = (r + 1) % n
    steps = []
    for t in range(start, n - 1):
        if t > 0:
            steps.append(Step(Op.WAIT, sem=0))
        c = (r - t) % n
        steps.append(Step(Op.PUT, (ChunkRef(r, OUT, c),), (ChunkRef(right, OUT, c),)))
        steps.append(Step(Op.SIGNAL, peer=right, sem=0))
    steps.append(Step(Op.WAIT, sem=0))  # the last chunk arrives from the left
    return steps


def all_reduce(n: int) -> Plan:
    """Ring all-reduce: reduce-scatter then all-gather, the last reduction fused with the first forward."""
    if n == 1:
        return _single(Collective.ALL_REDUCE, "ring")
    ranks = []
    for r in range(n):
        right = (r + 1) % n
        rs = _reduce_scatter_steps(r, n, lambda c: (ChunkRef(r, OUT, c), ChunkRef(right, OUT, c)))
        rs.append(Step(Op.SIGNAL, peer=right, sem=0))
        ranks.append(RankProgram(n, n, scratch_chunks=n, semaphores=1, lanes=(Lane(tuple(rs + _all_gather_steps(r, n, 1))),)))
    return Plan(Collective.ALL_REDUCE, n, tuple(ranks), name="ring")


def reduce_scatter(n: int) -> Plan:
    """Ring reduce-scatter: block c ends in rank c's output."""
    if n == 1:
        return _single(Collective.REDUCE_SCATTER, "ring")
    ranks = [RankProgram(n, 1, scratch_chunks=n, semaphores=1,
                         lanes=(Lane(tuple(_reduce_scatter_steps(r, n, lambda c: (ChunkRef(c, OUT, 0),)))),))
             for r in range(n)]
    return Plan(Collective.REDUCE_SCATTER, n, tuple(ranks), name="ring")


def all_gather(n: int) -> Plan:
    """Ring all-gather: each rank places its input, then forwards what arrives from the left."""
    if n == 1:
        return _single(Collective.ALL_GATHER, "ring")
    ranks = []
    for r in range(n):
        place = Step(Op.COPY, (ChunkRef(r, IN, 0),), (ChunkRef(r, OUT, r), ChunkRef((r + 1) % n, OUT, r)))
        steps = [place, Step(Op.SIGNAL, peer=(r + 1) % n, sem=0)] + _all_gather_steps(r, n, 1)
        ranks.append(RankProgram(1, n, semaphores=1, lanes=(Lane(tuple(steps)),)))
    return Plan(Collective.ALL_GATHER, n, tuple(ranks), name="ring")


def _single(collective: Collective, name: str) -> Plan:
    """A group of one: the output is the input."""
    step = Step(Op.COPY, (ChunkRef(0, IN, 0),), (ChunkRef(0, OUT, 0),))
    return Plan(collective, 1, (RankProgram(1, 1, lanes=(Lane((step,)),)),), name=name)
