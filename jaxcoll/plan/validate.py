"""Structural validation of a plan: every reference is in range and every step is well formed.

This is what the runtime relies on to never touch memory outside a buffer; the C++ decoder repeats the same
checks on the serialized form. Whether the plan computes its collective, and cannot deadlock, is the proving
checker's business (`jaxcoll.lang.check`).
"""

from __future__ import annotations

from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.ir import ZERO, Buffer, ChunkRef, Op, Plan, Step


def validate(plan: Plan) -> Plan:
    """Raise PlanError naming the rank, lane and step of the first structural fault; return the plan."""
    n, k = plan.nranks, plan.chunk_factor
    for r, prog in enumerate(plan.ranks):
        if prog.input_chunks < 1 or prog.input_chunks % plan.in_blocks:
            raise PlanError(f"rank {r}: input_chunks={prog.input_chunks} is not a positive multiple of "
                            f"in_blocks={plan.in_blocks}")
        if prog.input_chunks // plan.in_blocks != k:
            raise PlanError(f"rank {r}: input_chunks={prog.input_chunks} gives {prog.input_chunks // plan.in_blocks}"
                            f" chunks per block, rank 0 gives {k}; every rank must split blocks alike")
        if prog.output_chunks != plan.out_blocks * k:
            raise PlanError(f"rank {r}: output_chunks={prog.output_chunks}, expected out_blocks*k="
                            f"{plan.out_blocks}*{k}={plan.out_blocks * k}")
        if prog.scratch_chunks < 0 or prog.scratch_chunks % k:
            raise PlanError(f"rank {r}: scratch_chunks={prog.scratch_chunks} is not a multiple of k={k}")
        if prog.semaphores < 0:
            raise PlanError(f"rank {r}: semaphores={prog.semaphores} is negative")
    # Formatting a step is most of the cost of a pass over a large plan: messages are built only on failure.
    # The pass also repeats the constructors' checks of each step and ref, so that plans built from unchecked
    # steps (`Step.unchecked`) are held to the same rules. Enum members are compared by identity: hashing one
    # runs Python code.
    INPUT, OUTPUT, SCRATCH = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
    WAIT, SIGNAL, BARRIER, ZERO_OP = Op.WAIT, Op.SIGNAL, Op.BARRIER, Op.ZERO
    have_chunks = [(p.input_chunks, p.output_chunks, p.scratch_chunks) for p in plan.ranks]
    sems = [p.semaphores for p in plan.ranks]
    in_place = plan.in_place
    for r, prog in enumerate(plan.ranks):
        for l, lane in enumerate(prog.lanes):
            for i, step in enumerate(lane.steps):
                op, srcs, dsts = step.op, step.srcs, step.dsts
                if op is WAIT or op is SIGNAL or op is BARRIER:
                    if srcs or dsts or step.channel != -1:
                        _fail_step(plan, r, l, i, step)
                    if op is WAIT:
                        if not 0 <= step.sem < sems[r]:
                            _fail_step(plan, r, l, i, step)
                    elif op is SIGNAL:
                        if not 0 <= step.peer < n or not 0 <= step.sem < sems[step.peer]:
                            _fail_step(plan, r, l, i, step)
                    continue
                if type(op) is not Op or not dsts or (op is ZERO_OP) != (not srcs) or step.channel < -1:
                    _fail_step(plan, r, l, i, step)
                count = dsts[0].count
                position = dsts[0].index % k
                local = True
                for ref in srcs + dsts:
                    rank, buf, index = ref.rank, ref.buffer, ref.index
                    if not 0 <= rank < n or ref.count != count or index < 0 or index % k != position:
                        _fail_step(plan, r, l, i, step)
                    if buf is INPUT:
                        have = have_chunks[rank][0]
                    elif buf is OUTPUT:
                        have = have_chunks[rank][1]
                    elif buf is SCRATCH:
                        have = have_chunks[rank][2]
                    else:
                        _fail_step(plan, r, l, i, step)
                    if index + count > have:
                        _fail_step(plan, r, l, i, step)
                    if rank != r:
                        local = False
                if count < 1:
                    _fail_step(plan, r, l, i, step)
                if not in_place:
                    for ref in dsts:
                        if ref.buffer is INPUT:
                            _fail_step(plan, r, l, i, step)
                if step.channel >= 0 and local:
                    _fail_step(plan, r, l, i, step)
    if plan.expect is not None:
        _validate_expect(plan)
    return plan


def _validate_expect(plan: Plan) -> None:
    outputs = plan.expect.outputs
    if len(outputs) != plan.nranks:
        raise PlanError(f"expect lists {len(outputs)} ranks' outputs, the plan has nranks={plan.nranks}")
    for r, (row, prog) in enumerate(zip(outputs, plan.ranks)):
        if len(row) != prog.output_chunks:
            raise PlanError(f"expect: rank {r} lists {len(row)} output chunks, its output holds "
                            f"{prog.output_chunks}")
        for i, terms in enumerate(row):
            for t in terms or ():
                if t == ZERO:
                    continue
                src, index = t
                if not 0 <= src < plan.nranks or not 0 <= index < plan.ranks[src].input_chunks:
                    raise PlanError(f"expect: rank {r}, output chunk {i} names input chunk {index} of rank {src}, "
                                    f"which does not exist (nranks={plan.nranks}, input_chunks="
                                    f"{plan.ranks[0].input_chunks})")


def _fail_step(plan: Plan, r: int, l: int, i: int, step) -> None:
    """Raise the PlanError of the first check that `step` fails (the fast pass in `validate` found one)."""
    n, k = plan.nranks, plan.chunk_factor
    try:  # a step built without its constructors' checks (`Step.unchecked`) fails them here
        for ref in step.srcs + step.dsts:
            ChunkRef(ref.rank, ref.buffer, ref.index, ref.count)
        Step(step.op, step.srcs, step.dsts, step.peer, step.sem, step.channel)
    except (PlanError, ValueError) as e:
        raise PlanError(f"rank {r}, lane {l}, step {i}: {e}") from None
    if type(step.op) is not Op or any(type(ref.buffer) is not Buffer for ref in step.srcs + step.dsts):
        raise PlanError(f"rank {r}, lane {l}, step {i}: an unchecked step names its op and buffers by their "
                        f"Op and Buffer members, got op={step.op!r}, buffers "
                        f"{[ref.buffer for ref in step.srcs + step.dsts]!r}")
    where = f"rank {r}, lane {l}, step {i} ({step!r})"
    refs = step.srcs + step.dsts
    for ref in refs:
        if not 0 <= ref.rank < n:
            raise PlanError(f"{where}: rank {ref.rank} is out of range for nranks={n}")
        have = plan.ranks[ref.rank].chunks(ref.buffer)
        if ref.index + ref.count > have:
            raise PlanError(f"{where}: {ref!r} is out of range: rank {ref.rank}'s {ref.buffer.value} "
                            f"buffer holds {have} chunks")
    if refs and len({ref.index % k for ref in refs}) != 1:
        raise PlanError(f"{where}: chunks at different positions within their blocks (index mod k={k}) "
                        f"may differ in size and cannot be combined")
    if any(ref.buffer is Buffer.INPUT for ref in step.dsts) and not plan.in_place:
        raise PlanError(f"{where}: an out-of-place plan never writes its input buffer")
    if step.op is Op.SIGNAL:
        if not 0 <= step.peer < n:
            raise PlanError(f"{where}: signal peer {step.peer} is out of range for nranks={n}")
        if step.sem >= plan.ranks[step.peer].semaphores:
            raise PlanError(f"{where}: semaphore {step.sem} does not exist on rank {step.peer} "
                            f"(it has {plan.ranks[step.peer].semaphores})")
    if step.op is Op.WAIT and step.sem >= plan.ranks[r].semaphores:
        raise PlanError(f"{where}: semaphore {step.sem} does not exist on rank {r} "
                        f"(it has {plan.ranks[r].semaphores})")
    if step.channel >= 0 and all(ref.rank == r for ref in refs):
        raise PlanError(f"{where}: names channel {step.channel} but reaches no peer; a channel is a "
                        f"connection between two ranks")
    raise AssertionError(f"{where}: validate's fast pass and its messages disagree")
