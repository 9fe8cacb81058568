"""The compiler of the collective language: from a program's operations, in written order, to a Plan.

Each pass is a function of its own, tested on its own (tests/test_lang_passes.py):

    layout_scratch   named scratch buffers -> places in each rank's scratch
    replicate        instances=k: k copies of the program over k-times finer chunks
    pipeline         split every step into single-chunk pieces, so consecutive hops of a chunk overlap
    dependencies     for each step, the earlier steps it must follow (read/write conflicts on a chunk)
    fuse             reduce-then-put, read-reduce-then-put and get-then-put into one fused step
    drop_dead_writes scratch destinations nothing reads afterwards (left over by fusion) are not written
    assign_lanes     a lane for each step: one lane per (instance, peers reached, channel asked for) unless
                     the program said
    assign_channels  a channel for each step that reaches a peer: the one asked for, else the lowest one of
                     the pair that no other lane of the rank drives
    insert_sync      lanes in program order, a signal after and a wait before every cross-lane dependency, on
                     the semaphore the waiting operation asked for or one per (waiting lane, signalling lane)

Every assignment pass honours what the program asked for on an operation (`lane=`, `channel=`, `sem=`) and
assigns the rest around it; whether the result is safe is the checker's verdict, not the pass's.

The passes work on the instruction list (`Instr`, which `jaxcoll.lang.program` records) rather than on a Plan because a Plan has already
lost what dependency analysis needs: the sequential order of the program across ranks.
"""

from __future__ import annotations

import dataclasses
import types
from collections import defaultdict

from jaxcoll.lang import named_scratch
from jaxcoll.lang.check import check as check_plan
from jaxcoll.lang.check import location
from jaxcoll.lang.postcondition import stated
from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.ir import Buffer, ChunkRef, Lane, Op, Plan, RankProgram, Step
from jaxcoll.plan.validate import validate


@dataclasses.dataclass
class Instr:
    """One data step of a program, before lanes and synchronisation: the rank that executes it, the step, the
    lane asked for (None: the compiler chooses) and which instance (replica) of the program it belongs to."""

    rank: int
    step: Step
    lane: int | None = None
    instance: int = 0
    channel: int | None = None  # the channel asked for (None: the compiler chooses); see Step.channel
    sem: int | None = None  # the semaphore the step's waits use (None: the compiler chooses)


def _map_refs(instr: Instr, f) -> Instr:
    s = instr.step
    return dataclasses.replace(instr, step=dataclasses.replace(s, srcs=tuple(map(f, s.srcs)),
                                                               dsts=tuple(map(f, s.dsts))))


def layout_scratch(instrs: list[Instr], chunks: int, sizes: list[int]) -> tuple[list[Instr], int]:
    """Place named scratch buffers (placeholder indices, `jaxcoll.lang.named_scratch`) after the plain scratch chunks, each at
    a multiple of `chunks` so chunk positions within a block are kept. `sizes[n]` is buffer n's size.
    Returns the instructions and the scratch chunks each rank needs."""
    plain = max((ref.index + ref.count for i in instrs for ref in i.step.srcs + i.step.dsts
                 if ref.buffer is Buffer.SCRATCH and not named_scratch.is_placeholder(ref.index)), default=0)

    def up(x: int) -> int:
        return -(-x // chunks) * chunks

    bases, at = [], up(plain)
    for size in sizes:
        bases.append(at)
        at += up(size)

    def place(ref: ChunkRef) -> ChunkRef:
        if ref.buffer is Buffer.SCRATCH and named_scratch.is_placeholder(ref.index):
            number, offset = named_scratch.named_place(ref.index)
            return dataclasses.replace(ref, index=bases[number] + offset)
        return ref

    return [_map_refs(i, place) for i in instrs], at


def replicate(instrs: list[Instr], instances: int) -> list[Instr]:
    """instances=k: chunk range [i, i+n) becomes [i*k + t*n, i*k + (t+1)*n) in replica t, so replica t moves the
    t-th piece of every chunk; replicas are numbered in `Instr.instance` for lane assignment. A channel or
    semaphore asked for, c, becomes c*k + t in replica t (interleaved like the chunks), so replicas, which run on
    lanes of their own, never share one; a lane asked for is kept, so pinned replicas share that lane."""
    if instances == 1:
        return list(instrs)

    def spread(v: int | None, t: int) -> int | None:
        return None if v is None else v * instances + t

    out = []
    for t in range(instances):
        for instr in instrs:
            f = lambda ref, t=t: dataclasses.replace(ref, index=ref.index * instances + t * ref.count)  # noqa: E731
            out.append(dataclasses.replace(_map_refs(instr, f), instance=t, channel=spread(instr.channel, t),
                                           sem=spread(instr.sem, t)))
    return out


def pipeline(instrs: list[Instr], pieces: int) -> list[Instr]:
    """Split every chunk into `pieces` pieces and every step into one step per piece, in order, so that a later
    hop of piece 0 need not wait for the earlier hop of the last piece."""
    if pieces == 1:
        return list(instrs)
    out = []
    for instr in instrs:
        fine = _map_refs(instr, lambda ref: ChunkRef(ref.rank, ref.buffer, ref.index * pieces, ref.count * pieces))
        n = fine.step.srcs[0].count if fine.step.srcs else fine.step.dsts[0].count
        for p in range(n):
            out.append(_map_refs(fine, lambda ref, p=p: ChunkRef(ref.rank, ref.buffer, ref.index + p, 1)))
    return out


def _locs(space, refs) -> set:
    return {location(space, ref.rank, ref.buffer, j) for ref in refs for j in ref.indices()}


def dependencies(instrs: list[Instr], space) -> list[set[int]]:
    """For each instruction, the earlier ones it must follow: the last writer of each chunk it reads or writes
    (read/write, write/write) and the readers since that writer of each chunk it writes (write after read).
    `space` gives the aliasing of in-place plans (collective, in_place, chunk_factor)."""
    last_write: dict = {}
    readers: dict = defaultdict(set)
    deps = []
    for n, instr in enumerate(instrs):
        reads, writes = _locs(space, instr.step.srcs), _locs(space, instr.step.dsts)
        d = set()
        for loc in reads | writes:
            if loc in last_write:
                d.add(last_write[loc])
        for loc in writes:
            d |= readers[loc]
        d.discard(n)
        deps.append(d)
        for loc in reads:
            readers[loc].add(n)
        for loc in writes:
            last_write[loc] = n
            readers[loc] = set()
    return deps


def fuse(instrs: list[Instr], deps: list[set[int]]) -> tuple[list[Instr], list[set[int]]]:
    """Merge A and a later B into one step when B, on A's rank and lane, copies exactly what A wrote and could run
    right after A (every other step B depends on comes before A). The fused step reduces A's sources and writes
    A's and B's destinations: reduce + put -> reduce_put, read_reduce + put -> read_reduce_put, get + put ->
    read_reduce_put (the receive-copy-send of MSCCL). Steps that ask for different channels or semaphores are
    not fused; the fused step keeps what either asked for."""
    instrs, deps = list(instrs), [set(d) for d in deps]
    alive = [True] * len(instrs)
    for b in range(len(instrs)):
        B = instrs[b]
        if B.step.op not in (Op.PUT, Op.COPY) or len(B.step.srcs) != 1:
            continue
        cands = [a for a in deps[b] if alive[a]]
        for a in sorted(cands, reverse=True):
            A = instrs[a]
            if (A.rank != B.rank or A.lane != B.lane or A.instance != B.instance
                    or A.step.op not in (Op.REDUCE, Op.READ_REDUCE, Op.GET, Op.REDUCE_PUT, Op.READ_REDUCE_PUT)
                    or B.step.srcs[0] not in A.step.dsts or any(x > a for x in deps[b] - {a})
                    or None not in (A.channel, B.channel) and A.channel != B.channel
                    or None not in (A.sem, B.sem) and A.sem != B.sem):
                continue
            srcs_remote = any(r.rank != A.rank for r in A.step.srcs)
            dsts = A.step.dsts + B.step.dsts
            dsts_remote = any(r.rank != A.rank for r in dsts)
            if dsts_remote:
                op = Op.READ_REDUCE_PUT if srcs_remote else Op.REDUCE_PUT
            else:
                op = Op.READ_REDUCE if srcs_remote else (Op.REDUCE if len(A.step.srcs) > 1 else Op.COPY)
            instrs[a] = dataclasses.replace(A, step=Step(op, A.step.srcs, dsts),
                                            channel=A.channel if A.channel is not None else B.channel,
                                            sem=A.sem if A.sem is not None else B.sem)
            deps[a] |= deps[b] - {a}
            alive[b] = False
            for d in deps:  # whoever followed B now follows the fused A
                if b in d:
                    d.discard(b)
                    d.add(a)
            break
    keep = [n for n in range(len(instrs)) if alive[n]]
    renumber = {old: new for new, old in enumerate(keep)}
    return [instrs[n] for n in keep], [{renumber[x] for x in deps[n]} for n in keep]


def drop_dead_writes(instrs: list[Instr], space) -> list[Instr]:
    """Remove scratch destinations whose value no later step reads before it is overwritten, when the step has
    other destinations, on the step's own rank (fusion leaves the intermediate partial sum in scratch although the fused step already
    forwards it). Dependencies computed before stay valid: they only become conservative."""
    out = list(instrs)
    live: set = set()  # scratch locations read by some later step before being overwritten
    for n in range(len(out) - 1, -1, -1):
        step = out[n].step
        keep = []
        for ref in step.dsts:
            locs = _locs(space, [ref])
            dead = ref.buffer is Buffer.SCRATCH and ref.rank == out[n].rank and not (locs & live)
            if not dead:
                keep.append(ref)
        if keep and len(keep) < len(step.dsts):
            out[n] = dataclasses.replace(out[n], step=dataclasses.replace(step, dsts=tuple(keep)))
        live -= {loc for loc in _locs(space, out[n].step.dsts) if loc[1] is Buffer.SCRATCH}
        live |= {loc for loc in _locs(space, out[n].step.srcs) if loc[1] is Buffer.SCRATCH}
    return out


def assign_lanes(instrs: list[Instr], max_lanes: int | None = None) -> list[Instr]:
    """Give every instruction without a lane one: on each rank, one lane per (instance, set of peers the step
    reaches, channel asked for), in order of first use, so a link's traffic stays in order on one lane and
    independent links (and channels of one link) run in parallel. `max_lanes` folds the lanes of a rank onto
    that many. Lanes asked for are kept; automatic lanes are numbered around them."""
    keys: dict[int, dict] = defaultdict(dict)
    pinned: dict[int, set[int]] = defaultdict(set)
    for instr in instrs:
        if instr.lane is not None:
            pinned[instr.rank].add(instr.lane)
    out = []
    for instr in instrs:
        if instr.lane is not None:
            out.append(instr)
            continue
        peers = tuple(sorted({r.rank for r in instr.step.srcs + instr.step.dsts} - {instr.rank}))
        lanes = keys[instr.rank]
        key = (instr.instance, peers, instr.channel)
        if key not in lanes:
            free = (l for l in range(len(lanes) + len(pinned[instr.rank]) + 1) if l not in pinned[instr.rank])
            taken = set(lanes.values())
            lanes[key] = next(l for l in free if l not in taken)
        lane = lanes[key]
        if max_lanes:
            lane %= max_lanes
        out.append(dataclasses.replace(instr, lane=lane))
    return out


def assign_channels(instrs: list[Instr]) -> list[Instr]:
    """Write every step's channel (`Step.channel`): the one its operation asked for, else, for a step that
    reaches peers, the lowest channel that no other lane of its rank drives towards any of those peers, so a
    channel stays one ordered connection driven by one lane. Local steps get none. Runs after assign_lanes."""
    owner: dict[tuple[int, int, int], int] = {}  # (rank, peer, channel) -> lane driving it
    for instr in instrs:
        if instr.channel is not None:
            for p in {r.rank for r in instr.step.srcs + instr.step.dsts} - {instr.rank}:
                owner.setdefault((instr.rank, p, instr.channel), instr.lane)
    out = []
    for instr in instrs:
        peers = {r.rank for r in instr.step.srcs + instr.step.dsts} - {instr.rank}
        channel = instr.channel
        if channel is None and peers:
            channel = 0
            while any(owner.get((instr.rank, p, channel), instr.lane) != instr.lane for p in peers):
                channel += 1
            for p in peers:
                owner[instr.rank, p, channel] = instr.lane
        step = dataclasses.replace(instr.step, channel=-1 if channel is None else channel)
        out.append(dataclasses.replace(instr, step=step, channel=channel))
    return out


def insert_sync(instrs: list[Instr], deps: list[set[int]], space, nranks: int) -> tuple[list, list[int]]:
    """Lanes in program order with synchronisation: for each dependency between two lanes, a signal after the
    earlier step and, before the later one, enough waits to have consumed that signal. The signals go to the
    semaphore the later operation asked for (`Instr.sem`), else to one semaphore per (waiting lane, signalling
    lane) pair, numbered around the ones asked for, so the n-th wait on it is matched by its n-th signal. Lanes
    left with unconsumed signals wait for them at their end, so every signal has its wait. Returns
    (steps[rank][lane], semaphores per rank)."""
    nlanes = [0] * nranks
    for i in instrs:
        nlanes[i.rank] = max(nlanes[i.rank], i.lane + 1)
    # which earlier steps must signal whom
    needs: dict[int, list[int]] = defaultdict(list)  # instr -> cross-lane deps
    for n, d in enumerate(deps):
        me = (instrs[n].rank, instrs[n].lane)
        for x in sorted(d):
            if (instrs[x].rank, instrs[x].lane) != me:
                needs[n].append(x)

    def key_of(x: int, n: int) -> tuple:
        # (src rank, src lane, dst rank, dst lane, semaphore asked for or -1)
        sem = instrs[n].sem
        return instrs[x].rank, instrs[x].lane, instrs[n].rank, instrs[n].lane, -1 if sem is None else sem

    pair_signals: dict[tuple, list[int]] = defaultdict(list)  # key -> signalling instrs, in order
    for n in range(len(instrs)):
        for x in needs[n]:
            key = key_of(x, n)
            if x not in pair_signals[key]:
                pair_signals[key].append(x)
    for key in pair_signals:
        pair_signals[key].sort()
    pinned: dict[int, set[int]] = defaultdict(set)
    for i in instrs:
        if i.sem is not None:
            pinned[i.rank].add(i.sem)
    sem_of: dict[tuple, int] = {}
    next_free = [0] * nranks
    for key in sorted(pair_signals):
        dst = key[2]
        if key[4] >= 0:
            sem_of[key] = key[4]
            continue
        while next_free[dst] in pinned[dst]:
            next_free[dst] += 1
        sem_of[key] = next_free[dst]
        next_free[dst] += 1
    sems = [0] * nranks
    for key, sem in sem_of.items():
        sems[key[2]] = max(sems[key[2]], sem + 1)
    signals_after: dict[int, list[tuple]] = defaultdict(list)
    for key, xs in pair_signals.items():
        for x in xs:
            signals_after[x].append(key)
    lanes: list[list[list[Step]]] = [[[] for _ in range(nlanes[r])] for r in range(nranks)]
    consumed: dict[tuple, int] = defaultdict(int)
    for n, instr in enumerate(instrs):
        lane = lanes[instr.rank][instr.lane]
        for x in needs[n]:
            key = key_of(x, n)
            m = pair_signals[key].index(x) + 1
            while consumed[key] < m:
                lane.append(Step(Op.WAIT, sem=sem_of[key]))
                consumed[key] += 1
        lane.append(instr.step)
        for key in sorted(signals_after[n]):
            lane.append(Step(Op.SIGNAL, peer=key[2], sem=sem_of[key]))
    for key, xs in sorted(pair_signals.items()):
        while consumed[key] < len(xs):
            lanes[key[2]][key[3]].append(Step(Op.WAIT, sem=sem_of[key]))
            consumed[key] += 1
    return lanes, sems


def compile_program(prog, *, check: bool = True) -> Plan:
    """Run the passes over a recorded `jaxcoll.lang.program` and build (and check) its Plan. (The program's
    module imports this one, not the other way round: `prog` is read only through its public attributes.)"""
    if not prog.instrs:
        raise PlanError(f"program {prog.name!r} records no operations")
    instrs, scratch = layout_scratch(prog.instrs, prog.chunks, prog.named_scratch_sizes)
    instrs = replicate(instrs, prog.instances)
    instrs = pipeline(instrs, prog.pipeline)
    k = prog.chunks * prog.instances * prog.pipeline
    space = types.SimpleNamespace(collective=prog.collective, in_place=prog.in_place, chunk_factor=k)
    deps = dependencies(instrs, space)
    if prog.fuse:
        instrs, deps = fuse(instrs, deps)
        instrs = drop_dead_writes(instrs, space)
    instrs = assign_lanes(instrs, prog.max_lanes)
    instrs = assign_channels(instrs)
    lanes, sems = insert_sync(instrs, deps, space, prog.nranks)
    f = prog.instances * prog.pipeline
    ranks = tuple(RankProgram(prog.in_blocks * k, prog.out_blocks * k, scratch * f, sems[r],
                              tuple(Lane(tuple(steps)) for steps in lanes[r]))
                  for r in range(prog.nranks))
    expect = (stated(_scaled(prog.postcondition, f), prog.nranks, prog.out_blocks * k, prog.reduce_op)
              if prog.postcondition else None)
    plan = Plan(prog.collective, prog.nranks, ranks, name=prog.name, in_place=prog.in_place,
                in_blocks=prog.in_blocks, out_blocks=prog.out_blocks, root=prog.root, perm=prog.perm,
                expect=expect)
    validate(plan)
    if check:
        check_plan(plan)
    return plan


def _scaled(post, f: int):
    """A custom postcondition written over the program's chunks, applied to chunks refined f-fold."""
    if f == 1:
        return post
    from collections import Counter

    def refined(rank: int, index: int):
        want = post(rank, index // f)
        if want is None:
            return None
        return Counter({(c if len(c) != 2 else (c[0], c[1] * f + index % f)): m for c, m in want.items()})
    return refined
