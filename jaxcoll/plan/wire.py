"""The compact serialized form of a plan: a flat int32 array, embedded by the lowering as an attribute of the
custom call so that a compiled program carries its own plan. The C++ decoder is csrc/plan.cc.

Layout (every field one int32; docs/plan-ir.md has the table):
  header: MAGIC, VERSION, collective, nranks, in_blocks, out_blocks, flags (bit 0: in_place), protocol
  per rank: input_chunks, output_chunks, scratch_chunks, semaphores, nlanes,
            per lane: nsteps, per step: op, peer, sem, nsrc, ndst, (rank, buffer, index, count) * (nsrc + ndst)
"""

from __future__ import annotations

import numpy as np

from jaxcoll.plan.collectives import COLLECTIVE_CODES, from_code
from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.ir import BUFFER_CODES, OP_CODES, Buffer, ChunkRef, Lane, Op, Plan, RankProgram, Step

MAGIC = 0x4C43584A  # "JXCL" read as a little-endian int32
VERSION = 1
PROTOCOL_CODES = {"auto": 0, "ll": 1, "simple": 2}
HEADER = 8
FLAG_IN_PLACE = 1


def encode(plan: Plan) -> np.ndarray:
    """Serialize a plan into the int32 array the executors decode."""
    out = [MAGIC, VERSION, COLLECTIVE_CODES[plan.collective], plan.nranks, plan.in_blocks, plan.out_blocks,
           FLAG_IN_PLACE if plan.in_place else 0, PROTOCOL_CODES[plan.protocol]]
    for prog in plan.ranks:
        out += [prog.input_chunks, prog.output_chunks, prog.scratch_chunks, prog.semaphores, len(prog.lanes)]
        for lane in prog.lanes:
            out.append(len(lane.steps))
            for s in lane.steps:
                out += [OP_CODES[s.op], s.peer, s.sem, len(s.srcs), len(s.dsts)]
                for ref in s.srcs + s.dsts:
                    out += [ref.rank, BUFFER_CODES[ref.buffer], ref.index, ref.count]
    return np.asarray(out, dtype=np.int32)


def decode(words) -> Plan:
    """Inverse of encode, less `root` and `perm` (metadata for the checker that the executor does not need);
    raises PlanError on a truncated or corrupt array."""
    w = [int(x) for x in np.asarray(words, dtype=np.int64).ravel()]
    pos = 0

    def take(n: int) -> list[int]:
        nonlocal pos
        if pos + n > len(w):
            raise PlanError(f"serialized plan is truncated at word {pos} (needs {n} more, has {len(w) - pos})")
        pos += n
        return w[pos - n:pos]

    magic, version, coll, nranks, in_blocks, out_blocks, flags, protocol = take(HEADER)
    if magic != MAGIC or version != VERSION:
        raise PlanError(f"not a jaxcoll plan of version {VERSION}: magic={magic:#x}, version={version}")
    try:
        collective = from_code(coll)
    except PlanError as e:
        raise PlanError(f"serialized plan: {e} at word 2") from None
    try:
        protocol_name = {v: k for k, v in PROTOCOL_CODES.items()}[protocol]
        ops, buffers = list(Op), list(Buffer)
        ranks = []
        for _ in range(nranks):
            ic, oc, sc, sems, nlanes = take(5)
            lanes = []
            for _ in range(nlanes):
                (nsteps,) = take(1)
                steps = []
                for _ in range(nsteps):
                    op, peer, sem, nsrc, ndst = take(5)
                    refs = [ChunkRef(a, buffers[b], c, d) for a, b, c, d in
                            (take(4) for _ in range(nsrc + ndst))]
                    steps.append(Step(ops[op], tuple(refs[:nsrc]), tuple(refs[nsrc:]), peer, sem))
                lanes.append(Lane(tuple(steps)))
            ranks.append(RankProgram(ic, oc, sc, sems, tuple(lanes)))
    except (IndexError, KeyError) as e:
        raise PlanError(f"serialized plan has an unknown code near word {pos}: {e}") from e
    if pos != len(w):
        raise PlanError(f"serialized plan has {len(w) - pos} trailing words")
    return Plan(collective, nranks, tuple(ranks), in_place=bool(flags & FLAG_IN_PLACE), in_blocks=in_blocks,
                out_blocks=out_blocks, protocol=protocol_name)
