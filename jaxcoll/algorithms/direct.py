"""Direct (one-shot, all-pairs) schedules: every rank reaches every peer's buffer in one step. With all buffers
mapped (shared memory on CPU, peer pointers on one GPU node) this is the lowest-latency schedule there is: a
single data step per rank between the executor's entry rendezvous and exit barrier, no signals at all.

Reductions run over ranks 0..N-1 in that order on every rank, so every rank's result is bitwise identical.
"""

from __future__ import annotations

from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step

IN, OUT = Buffer.INPUT, Buffer.OUTPUT


def _plan(collective, n, programs, name="direct", **kw) -> Plan:
    return Plan(collective, n, tuple(programs), name=name, **kw)


def _lane(*steps: Step) -> tuple[Lane, ...]:
    return (Lane(steps),)


def all_reduce(n: int) -> Plan:
    """Each rank reads every rank's whole input and reduces it into its own output: N^2 S bytes read in all,
    the choice for small messages where one step beats any saving in traffic."""
    return _plan(Collective.ALL_REDUCE, n, [
        RankProgram(1, 1, lanes=_lane(Step(Op.READ_REDUCE, tuple(ChunkRef(p, IN, 0) for p in range(n)),
                                           (ChunkRef(r, OUT, 0),))))
        for r in range(n)])


def all_gather(n: int) -> Plan:
    """Each rank writes its input into block r of every rank's output."""
    return _plan(Collective.ALL_GATHER, n, [
        RankProgram(1, n, lanes=_lane(Step(Op.PUT if n > 1 else Op.COPY, (ChunkRef(r, IN, 0),),
                                           tuple(ChunkRef(p, OUT, r) for p in range(n)))))
        for r in range(n)])


def reduce_scatter(n: int) -> Plan:
    """Rank r reduces block r of every rank's input into its output."""
    return _plan(Collective.REDUCE_SCATTER, n, [
        RankProgram(n, 1, lanes=_lane(Step(Op.READ_REDUCE, tuple(ChunkRef(p, IN, r) for p in range(n)),
                                           (ChunkRef(r, OUT, 0),))))
        for r in range(n)])


def all_to_all(n: int) -> Plan:
    """Rank r writes its input block p into block r of rank p's output."""
    return _plan(Collective.ALL_TO_ALL, n, [
        RankProgram(n, n, lanes=_lane(*(Step(Op.PUT if p != r else Op.COPY, (ChunkRef(r, IN, p),),
                                             (ChunkRef(p, OUT, r),)) for p in range(n))))
        for r in range(n)])


def broadcast(n: int, root: int) -> Plan:
    """Every rank reads the root's input into its own output, spreading the copying over all ranks."""
    return _plan(Collective.BROADCAST, n, [
        RankProgram(1, 1, lanes=_lane(Step(Op.GET if r != root else Op.COPY, (ChunkRef(root, IN, 0),),
                                           (ChunkRef(r, OUT, 0),))))
        for r in range(n)], root=root)


def ppermute(n: int, perm: tuple[tuple[int, int], ...]) -> Plan:
    """Each source writes its input into its destination's output; a rank nobody sends to gets zeros."""
    sends = dict(perm)
    receivers = set(sends.values())
    programs = []
    for r in range(n):
        steps = []
        if r in sends:
            d = sends[r]
            steps.append(Step(Op.PUT if d != r else Op.COPY, (ChunkRef(r, IN, 0),), (ChunkRef(d, OUT, 0),)))
        if r not in receivers:
            steps.append(Step(Op.ZERO, dsts=(ChunkRef(r, OUT, 0),)))
        programs.append(RankProgram(1, 1, lanes=_lane(*steps)))
    return _plan(Collective.PPERMUTE, n, programs, perm=tuple(perm))
