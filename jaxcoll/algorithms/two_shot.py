"""Two-shot all-reduce: reduce-scatter, then all-gather, each in one direct step. Rank r owns chunk r of N: it
reduces that chunk over all ranks' inputs and writes the result straight into every rank's output, one fused
read-reduce-put step. Every input byte is read once and every output byte written once (2 N S bytes of memory
traffic in all, the minimum for an all-reduce of N buffers of S bytes), and the work is spread evenly over
the ranks. Each chunk is reduced once, over ranks 0..N-1 in order, so all ranks receive identical bits.
"""

from __future__ import annotations

from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step


def all_reduce(n: int) -> Plan:
    programs = []
    for r in range(n):
        step = Step(Op.READ_REDUCE_PUT if n > 1 else Op.COPY,
                    tuple(ChunkRef(p, Buffer.INPUT, r) for p in range(n)),
                    tuple(ChunkRef(p, Buffer.OUTPUT, r) for p in range(n)))
        programs.append(RankProgram(n, n, lanes=(Lane((step,)),)))
    return Plan(Collective.ALL_REDUCE, n, tuple(programs), name="two_shot")
