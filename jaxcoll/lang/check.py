"""The proving checker: a plan computes its collective, cannot deadlock and has no data race.

It models the executor contract of docs/plan-ir.md: a rendezvous at entry (every buffer live), semaphores at
zero, a wait consumes one signal, lanes of a rank meet at barriers, and a barrier at exit. Checks, in order:

1. structure (`jaxcoll.plan.validate`);
2. synchronisation: each semaphore is waited on by one lane, every wait has a signal and every signal a wait,
   every lane of a rank passes the same number of barriers, and a named channel (the connection a transfer
   uses) is driven by one lane of the sending rank, so its transfers have one order;
3. deadlock: the lanes are run with semaphore counts (`jaxcoll.lang.stepper`). Signals only ever add, so the system is monotone and one
   greedy run decides it: if it gets stuck, every execution gets stuck, and the stuck lanes are reported;
4. races: a happens-before relation is built from lane order, barriers and the signals each wait is
   *guaranteed* to have seen; two accesses to one chunk (at least one a write) that it leaves unordered are a
   race, whether two lanes of a rank or a rank and its peer;
5. provenance: with every conflicting pair ordered, any execution computes what the greedy one computes, so
   the greedy order is executed on symbolic values (multisets of input contributions) and every output chunk
   is compared with the collective's postcondition (`jaxcoll.lang.postcondition`; a custom plan states its
   own in `Plan.expect`).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from jaxcoll.lang import stepper
from jaxcoll.lang.postcondition import ZERO, Postcondition, describe, expected, holds
from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.collectives import InPlace, definition
from jaxcoll.plan.ir import Buffer, Op, Plan, Step
from jaxcoll.plan.validate import validate

Node = tuple[int, int, int]  # (rank, lane, step position)


def where(plan: Plan, node: Node) -> str:
    r, l, i = node
    return f"rank {r}, lane {l}, step {i} ({plan.ranks[r].lanes[l].steps[i]!r})"


def location(plan: Plan, rank: int, buffer: Buffer, index: int) -> tuple[int, Buffer, int]:
    """The memory a chunk occupies: in-place plans alias input and output chunks (plan-ir.md)."""
    if plan.in_place:
        aliasing = definition(plan.collective).in_place
        if aliasing is InPlace.INPUT_IN_OUTPUT:
            if buffer is Buffer.INPUT:
                return rank, Buffer.OUTPUT, rank * plan.chunk_factor + index
        elif aliasing is InPlace.OUTPUT_IN_INPUT:
            if buffer is Buffer.OUTPUT:
                return rank, Buffer.INPUT, rank * plan.chunk_factor + index
        elif buffer is Buffer.INPUT:
            return rank, Buffer.OUTPUT, index
    return rank, buffer, index


def _chunks(plan: Plan, refs) -> list[list[tuple]]:
    """Per chunk offset t, the locations of refs' t-th chunks."""
    count = refs[0].count if refs else 0
    return [[location(plan, ref.rank, ref.buffer, ref.index + t) for ref in refs] for t in range(count)]


def _sync_structure(plan: Plan) -> None:
    waiters: dict[tuple[int, int], set[int]] = defaultdict(set)
    waits: dict[tuple[int, int], list[Node]] = defaultdict(list)
    signals: dict[tuple[int, int], list[Node]] = defaultdict(list)
    for r, l, i, step in plan.steps():
        if step.op is Op.WAIT:
            waiters[r, step.sem].add(l)
            waits[r, step.sem].append((r, l, i))
        elif step.op is Op.SIGNAL:
            signals[step.peer, step.sem].append((r, l, i))
    for (r, sem), lanes in waiters.items():
        if len(lanes) > 1:
            first = {}
            for node in waits[r, sem]:
                first.setdefault(node[1], node)
            a, b = sorted(first.values())[:2]
            raise PlanError(f"{where(plan, b)}: semaphore {sem} is waited on by lanes {sorted(lanes)} of rank {r} "
                            f"(also by {where(plan, a)}); a semaphore must have one waiting lane, so which wait "
                            f"consumes which signal is defined")
    for key in set(waits) | set(signals):
        w, s = waits.get(key, []), signals.get(key, [])
        if len(w) > len(s):
            node = w[len(s)]
            src = ", ".join(f"rank {a} lane {b} step {c}" for a, b, c in s) or "none"
            raise PlanError(f"{where(plan, node)}: wait number {len(s) + 1} on semaphore {key[1]} of rank "
                            f"{key[0]} has no matching signal: {len(w)} waits but {len(s)} signals "
                            f"(signals from: {src})")
        if len(s) > len(w):
            node = s[len(w)]
            dst = ", ".join(f"lane {b} step {c}" for _, b, c in w) or "nowhere"
            raise PlanError(f"{where(plan, node)}: signal number {len(w) + 1} to semaphore {key[1]} of rank "
                            f"{key[0]} has no matching wait: rank {key[0]} waits on it {len(w)} times "
                            f"({dst}) but it is signalled {len(s)} times; expected one wait per signal")
    for r, prog in enumerate(plan.ranks):
        counts = [sum(s.op is Op.BARRIER for s in lane.steps) for lane in prog.lanes]
        if len(set(counts)) > 1:
            raise PlanError(f"rank {r}: lanes pass different numbers of barriers ({counts}); every lane of a "
                            f"rank must reach each barrier or the others wait forever")


def _channels(plan: Plan) -> None:
    users: dict[tuple[int, int, int], Node] = {}  # (sending rank, peer, channel) -> first step using it
    for r, l, i, step in plan.steps():
        if step.channel < 0:
            continue
        for peer in sorted({ref.rank for ref in step.srcs + step.dsts} - {r}):
            first = users.setdefault((r, peer, step.channel), (r, l, i))
            if first[1] != l:
                raise PlanError(f"{where(plan, (r, l, i))}: uses channel {step.channel} to rank {peer}, which "
                                f"{where(plan, first)} drives from another lane; a channel is one ordered "
                                f"connection, driven by one lane of each rank")


def schedule(plan: Plan) -> list[Node]:
    """One execution of the plan under the executor contract, as the order its steps complete (barriers of a
    rank complete together): each lane in turn runs as far as it can, until none can go on. Raises PlanError
    naming the stuck lanes if the plan can deadlock."""
    run = stepper.for_plan(plan)
    order: list[Node] = []
    progress = True
    while progress:
        progress = False
        for key in run.lanes:
            done = run.run(key)
            if done:
                order += [(*lane, i) for lane, i in done]
                progress = True
    stuck = [(*lane, i) for lane, i in run.unfinished()]
    if stuck:
        lines = []
        for node in stuck:
            step = plan.ranks[node[0]].lanes[node[1]].steps[node[2]]
            why = (f"waits for a signal on semaphore {step.sem}, which no running lane will send"
                   if step.op is Op.WAIT else "waits at a barrier that another lane of its rank never reaches")
            lines.append(f"{where(plan, node)} {why}")
        raise PlanError("deadlock: " + "; ".join(lines))
    return order


def happens_before(plan: Plan, order: list[Node]) -> dict[Node, int]:
    """For every step, the bitset (over positions in `order`) of steps guaranteed to complete before it.

    A wait is guaranteed to follow signal x when fewer other signals than the wait's number could have arrived
    without x (signals ordered after x, or after the wait, cannot). This is exact for one signalling lane per
    semaphore (the n-th wait follows the n-th signal) and for "all peers signal, then wait N times"."""
    pos = {node: p for p, node in enumerate(order)}
    prog_prev: dict[Node, Node] = {}
    barrier_groups: dict[Node, list[Node]] = {}
    signals: dict[tuple[int, int], list[Node]] = defaultdict(list)
    wait_number: dict[Node, int] = {}
    for r, prog in enumerate(plan.ranks):
        per_lane = []
        for l, lane in enumerate(prog.lanes):
            count = Counter()
            bars = []
            for i, step in enumerate(lane.steps):
                if i:
                    prog_prev[r, l, i] = (r, l, i - 1)
                if step.op is Op.SIGNAL:
                    signals[step.peer, step.sem].append((r, l, i))
                elif step.op is Op.WAIT:
                    count[step.sem] += 1
                    wait_number[r, l, i] = count[step.sem]
                elif step.op is Op.BARRIER:
                    bars.append((r, l, i))
            per_lane.append(bars)
        for group in zip(*per_lane):
            for node in group:
                barrier_groups[node] = list(group)
    wait_edges: dict[Node, list[Node]] = {}
    hb: dict[Node, int] = {}
    while True:
        new: dict[Node, int] = {}
        for node in order:
            bits = 0
            preds = []
            if node in barrier_groups:
                preds = [prog_prev[m] for m in barrier_groups[node] if m in prog_prev]
            elif node in prog_prev:
                preds = [prog_prev[node]]
            preds += wait_edges.get(node, [])
            for p in preds:
                bits |= new[p] | (1 << pos[p])
            new[node] = bits
        edges: dict[Node, list[Node]] = {}
        for w, n in wait_number.items():
            step = plan.ranks[w[0]].lanes[w[1]].steps[w[2]]
            sigs = signals[w[0], step.sem]
            if len({(r, l) for r, l, _ in sigs}) == 1:  # one signalling lane: the n-th wait meets the n-th signal
                edges[w] = [sigs[n - 1]]
                continue
            sure = []
            for x in sigs:
                could = sum(1 for y in sigs if y != x and not (new[y] >> pos[x]) & 1
                            and not (new[y] >> pos[w]) & 1)
                if could < n:
                    sure.append(x)
            edges[w] = sure
        if edges == wait_edges and new == hb:
            return hb
        wait_edges, hb = edges, new


def _accesses(plan: Plan, step: Step) -> tuple[list, list]:
    reads = [loc for row in _chunks(plan, step.srcs) for loc in row]
    writes = [loc for row in _chunks(plan, step.dsts) for loc in row]
    return reads, writes


def _races(plan: Plan, order: list[Node], hb: dict[Node, int]) -> None:
    pos = {node: p for p, node in enumerate(order)}
    touches: dict[tuple, list[tuple[Node, bool]]] = defaultdict(list)
    for node in order:
        step = plan.ranks[node[0]].lanes[node[1]].steps[node[2]]
        if not step.op.is_data:
            continue
        reads, writes = _accesses(plan, step)
        for loc in set(writes):
            touches[loc].append((node, True))
        for loc in set(reads) - set(writes):
            touches[loc].append((node, False))
    for loc, acc in touches.items():
        for a in range(len(acc)):
            for b in range(a + 1, len(acc)):
                (na, wa), (nb, wb) = acc[a], acc[b]
                if not (wa or wb) or na == nb:
                    continue
                if (hb[nb] >> pos[na]) & 1 or (hb[na] >> pos[nb]) & 1:
                    continue
                r, buf, i = loc
                verb = lambda w: "writes" if w else "reads"  # noqa: E731
                raise PlanError(
                    f"race on r{r}.{buf.value}[{i}]: {where(plan, na)} {verb(wa)} it and {where(plan, nb)} "
                    f"{verb(wb)} it, and no lane order, barrier or signal/wait orders the two; expected a "
                    f"signal after the first and a wait before the second")


def execute(plan: Plan, order: list[Node] | None = None) -> dict[tuple, Counter]:
    """Run the plan on symbolic values in `order` (default: the checker's schedule) and return the final
    value of every chunk location that holds one. Reading a chunk nothing has written is a PlanError."""
    order = schedule(plan) if order is None else order
    mem: dict[tuple, Counter] = {}
    for r, prog in enumerate(plan.ranks):
        for i in range(prog.input_chunks):
            mem[location(plan, r, Buffer.INPUT, i)] = Counter({(r, i): 1})
    for node in order:
        step = plan.ranks[node[0]].lanes[node[1]].steps[node[2]]
        if not step.op.is_data:
            continue
        srcs, dsts = _chunks(plan, step.srcs), _chunks(plan, step.dsts)
        for t in range(len(dsts)):
            if step.op is Op.ZERO:
                v = Counter({ZERO: 1})
            else:
                v = Counter()
                for loc, ref in zip(srcs[t], step.srcs):
                    if loc not in mem:
                        raise PlanError(f"{where(plan, node)} reads r{ref.rank}.{ref.buffer.value}"
                                        f"[{ref.index + t}], which holds no value at that point: nothing "
                                        f"writes it earlier in the call")
                    v += mem[loc]
            for loc in dsts[t]:
                mem[loc] = v
    return mem


def outputs(plan: Plan, mem: dict[tuple, Counter]) -> dict[tuple[int, int], Counter | None]:
    """The symbolic value of every output chunk, keyed by (rank, output index)."""
    return {(r, i): mem.get(location(plan, r, Buffer.OUTPUT, i))
            for r, prog in enumerate(plan.ranks) for i in range(prog.output_chunks)}


def check(plan: Plan, *, postcondition: Postcondition | None = None) -> Plan:
    """Prove that `plan` computes its collective without deadlock or race; return it, or raise PlanError
    naming the rank, lane and step at fault and what was expected there.

    `postcondition(rank, output_index)` gives the expected symbolic value of an output chunk (a Counter of
    (rank, input index), see `jaxcoll.lang.postcondition.value`) or None for "any"; it is required for custom
    plans that state no `Plan.expect` and overrides the collective's own (it is compared for sum: each
    contribution exactly once)."""
    validate(plan)
    _sync_structure(plan)
    _channels(plan)
    order = schedule(plan)
    _races(plan, order, happens_before(plan, order))
    mem = execute(plan, order)
    want = expected(plan, postcondition)
    reduce_op = plan.expect.reduce_op if plan.expect is not None and postcondition is None else "sum"
    for (r, i), got in outputs(plan, mem).items():
        exp = want(r, i)
        if exp is None or holds(got, exp, reduce_op):
            continue
        have = got or Counter()
        if reduce_op == "sum":
            missing, extra = exp - have, have - exp
            detail = []
        else:  # idempotent: compare the sets of contributions
            missing, extra = Counter(set(exp) - set(have)), Counter(set(have) - set(exp))
            detail = [f"{reduce_op} needs each contribution at least once and no other"]
        if missing:
            detail.append(f"missing {describe(missing)}")
        if extra:
            detail.append(f"extra {describe(extra)}")
        raise PlanError(f"rank {r}: output chunk {i} holds {describe(got)}, expected {describe(exp)} "
                        f"for {plan.collective.value} ({'; '.join(detail)})")
    return plan
