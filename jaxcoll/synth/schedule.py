"""From a dependency graph of chunk moves to a plan: lanes, and the signals and waits that order them.

Synthesizers say *what* moves (a data step on some rank), in which lane of that rank it runs, its priority, and
which earlier moves it depends on. `Schedule.build` orders each lane by priority and turns every dependency that
crosses lanes into a semaphore: the producer's lane signals after its move, the consumer's lane waits before its
own. Semaphores are per (consumer lane, producer lane) stream, and a stream's signals are counted in the order
the producer issues them, so the consumer knows how many waits reach the signal it needs.

Deadlock freedom: a move's priority must exceed the priorities of its dependencies (`build` checks it). Every
lane runs in priority order, so by induction on priority every move finishes.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Hashable, Sequence

from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step, validate


@dataclasses.dataclass
class Move:
    rank: int
    lane: Hashable
    priority: tuple
    step: Step
    deps: tuple[int, ...]


class Schedule:
    """A plan under construction. `chunk_factor` is k: each block splits into k chunks."""

    def __init__(self, collective: Collective, nranks: int, chunk_factor: int, name: str = "",
                 in_blocks: int = 0, out_blocks: int = 0):
        self.collective = Collective(collective)
        self.nranks = nranks
        self.k = chunk_factor
        self.name = name
        probe = Plan(self.collective, nranks, tuple(RankProgram(1, 1) for _ in range(nranks)),
                     in_blocks=in_blocks, out_blocks=out_blocks)
        self.in_blocks, self.out_blocks = probe.in_blocks, probe.out_blocks
        self.moves: list[Move] = []
        self._scratch = [defaultdict(int) for _ in range(nranks)]  # rank -> position -> slots used

    def scratch(self, rank: int, position: int) -> ChunkRef:
        """A fresh scratch chunk on `rank` at position `position` (mod k) of its block: written once."""
        j = position % self.k
        slot = self._scratch[rank][j]
        self._scratch[rank][j] += 1
        return ChunkRef(rank, Buffer.SCRATCH, slot * self.k + j)

    def move(self, rank: int, lane: Hashable, priority: tuple, op: Op, srcs: Sequence[ChunkRef],
             dsts: Sequence[ChunkRef], deps: Sequence[int] = ()) -> int:
        """Add a data step run by `rank` in its lane `lane`; returns the move's id for later `deps`."""
        self.moves.append(Move(rank, lane, tuple(priority), Step(op, tuple(srcs), tuple(dsts)), tuple(deps)))
        return len(self.moves) - 1

    def list_schedule(self, topology, chunk_bytes: float = 1 << 20, passes: str = "f") -> None:
        """Reorder every lane by greedy list scheduling: each lane is a server whose rate is its share of the
        links under max-min fair sharing when all lanes send at once (`jaxcoll.sim.max_min_rates`, the
        simulator's own rule); a free lane starts, among its moves whose inputs have landed, the one of smallest
        priority. Each move's priority becomes (start time, old priority). A lane then never waits on a move
        whose inputs come later than those of a move behind it, which removes the head-of-line stalls of a
        fixed order. Dependencies start strictly earlier, so `build`'s deadlock argument still holds.

        `passes` is a string of directions, run in turn: "f" forwards as above, "b" backwards in time: from the
        moves nothing depends on, a move starts (in reversed time) once every move that uses it is done and its
        bytes have landed. A backward pass packs the end of the run the way a forward pass packs its start: a
        reduction in-tree is a broadcast out-tree run backwards, so "b" gives reduce_scatter the schedule that
        "f" gives all_gather (every link busy up to the end, the pipeline's fill at the start where the
        leaves' inputs are ready, instead of a drain that waits on whole subtrees). A pass after the first
        takes its order from the previous one: forwards by latest start, backwards by earliest finish (the
        forward-backward improvement of project scheduling), so "fbf" keeps the greedy start of "f" and ends
        with the moves that have least left to do downstream. A backward pass's priority is (minus its
        reversed finish time, old priority): a dependency finishes strictly later in reversed time, so it
        still comes first."""
        import heapq

        import numpy as np

        from jaxcoll.sim.engine import max_min_rates

        moves = self.moves
        lanes = sorted({(m.rank, m.lane) for m in moves}, key=repr)
        lane_id = {key: i for i, key in enumerate(lanes)}
        peer = [next((ref.rank for ref in (*m.step.dsts, *m.step.srcs) if ref.rank != m.rank), m.rank)
                for m in moves]
        lane_peer: dict[int, int] = {}
        for i, m in enumerate(moves):
            lane_peer.setdefault(lane_id[m.rank, m.lane], peer[i])
        cap = np.array([l.bandwidth_GBps for l in topology.links])
        remote = [l for l in range(len(lanes)) if lane_peer[l] != lanes[l][0]]
        routes = [np.asarray(topology.route(lanes[l][0], lane_peer[l]) if lanes[l][0] != lane_peer[l]
                             else topology.route(lane_peer[l], lanes[l][0])) for l in remote]
        rate = np.full(len(lanes), float(topology.memory_bandwidth_GBps or max(cap)))
        if remote:
            rate[remote] = max_min_rates(routes, cap)
        latency = [0.0] * len(lanes)
        for l in remote:
            latency[l] = topology.path_latency_us(lanes[l][0], lane_peer[l]) * 1e-6
        lane = [lane_id[m.rank, m.lane] for m in moves]
        duration = [max(ref.count for ref in (*m.step.srcs, *m.step.dsts)) * chunk_bytes / (rate[lane[i]] * 1e9)
                    * (len(m.step.srcs) if peer[i] == m.rank else 1) for i, m in enumerate(moves)]
        users: list[list[int]] = [[] for _ in moves]
        for i, m in enumerate(moves):
            for d in m.deps:
                users[d].append(i)
        deps = [list(m.deps) for m in moves]
        push, pop = heapq.heappush, heapq.heappop

        def run(key, reverse: bool) -> list[float]:
            """Start times of one pass (in reversed time if `reverse`)."""
            after = deps if reverse else users  # the moves that wait for a move
            waiting = [len(u) for u in users] if reverse else [len(d) for d in deps]
            ready_at = [0.0] * len(moves)
            queue: list[list] = [[] for _ in lanes]  # per lane: heap of (priority, move) whose inputs are there
            events = [(0.0, i, 0, i) for i in range(len(moves)) if not waiting[i]]
            seq = len(moves)  # (time, order, kind, x): kind 0 = a move's inputs arrive, 1 = a lane frees up
            heapq.heapify(events)
            idle = [True] * len(lanes)
            start = [0.0] * len(moves)
            while events:
                now, _, kind, x = pop(events)
                if kind == 0:
                    l = lane[x]
                    push(queue[l], (key[x], x))
                else:
                    l = x
                    idle[l] = True
                if idle[l] and queue[l]:
                    _, i = pop(queue[l])
                    idle[l] = False
                    start[i] = now
                    done = now + duration[i]
                    push(events, (done, seq, 1, l))
                    seq += 1
                    for u in after[i]:
                        # a put's bytes land one route latency after it (in reversed time the put is u)
                        arrive = done + latency[lane[u] if reverse else l]
                        if ready_at[u] < arrive:
                            ready_at[u] = arrive
                        waiting[u] -= 1
                        if not waiting[u]:
                            push(events, (ready_at[u], seq, 0, u))
                            seq += 1
            return start

        old = [m.priority for m in moves]
        negated = None
        time = None  # forward-time order of the previous pass: smaller is earlier
        for direction in passes:
            if direction == "f":
                key = old if time is None else list(zip(time, old))
                start = run(key, False)
                time = start
            elif direction == "b":
                if negated is None:
                    negated = [tuple(-x for x in p) for p in old]
                # reversed time runs from the end: moves that finish last go first
                key = negated if time is None else [(-t - d, n) for t, d, n in zip(time, duration, negated)]
                start = run(key, True)
                time = [-(s + d) for s, d in zip(start, duration)]
            else:
                raise ValueError(f"list_schedule passes are 'f' or 'b', got {passes!r}")
        for m, t in zip(moves, time):
            m.priority = (t, m.priority)

    def build(self) -> Plan:
        moves = self.moves
        for i, m in enumerate(moves):
            for d in m.deps:
                if not moves[d].priority < m.priority:
                    raise AssertionError(f"move {i} {m.step!r} (priority {m.priority}) depends on move {d} "
                                         f"{moves[d].step!r} of priority {moves[d].priority}: not earlier")
        keys: list[set] = [set() for _ in range(self.nranks)]
        for m in moves:
            keys[m.rank].add(m.lane)
        lane_keys = [sorted(k, key=repr) for k in keys]
        lane_of = [{key: i for i, key in enumerate(keys)} for keys in lane_keys]
        order = sorted(range(len(moves)), key=[m.priority for m in moves].__getitem__)  # stable: ties by id
        where = [(m.rank, lane_of[m.rank][m.lane]) for m in moves]
        # A stream is (consumer lane, producer lane); it gets a semaphore on the consumer's rank. All of a
        # stream's signals come from one producer lane, issued in priority order, so the n-th signal of a stream
        # is the n-th of its producer's moves (in priority order) that the consumer lane depends on.
        sems: list[dict] = [{} for _ in range(self.nranks)]
        signals_after: dict[int, list[tuple[int, int]]] = defaultdict(list)  # move -> [(peer, sem)]
        waits_for: dict[int, list[tuple[int, int]]] = {}  # move -> [(sem, producer move)]
        for i in order:
            m = moves[i]
            wi, rank_sems = where[i], sems[m.rank]
            for d in m.deps:
                wd = where[d]
                if wd != wi:
                    sem = rank_sems.setdefault((wi, wd), len(rank_sems))
                    waits_for.setdefault(i, []).append((sem, d))
                    after = signals_after[d]
                    if (m.rank, sem) not in after:
                        after.append((m.rank, sem))
        ordinal: dict[tuple[int, int, int], int] = {}
        issued: dict[tuple[int, int], int] = defaultdict(int)
        for d in order:
            for peer, sem in signals_after.get(d, ()):
                issued[peer, sem] += 1
                ordinal[d, peer, sem] = issued[peer, sem]
        # Sync steps are immutable and identical wherever they name the same semaphore: build each once.
        waits = [[] for _ in range(self.nranks)]
        signals: dict[tuple[int, int], Step] = {}
        lanes: list[list[list[Step]]] = [[[] for _ in keys] for keys in lane_keys]
        consumed = [[] for _ in range(self.nranks)]
        for i in order:
            m = moves[i]
            r, l = where[i]
            steps = lanes[r][l]
            if i in waits_for:
                have, wait = consumed[r], waits[r]
                need = [(sem, ordinal[d, r, sem]) for sem, d in waits_for[i]]
                for sem, n in (sorted(need) if len(need) > 1 else need):
                    while len(have) <= sem:
                        have.append(0)
                        wait.append(Step(Op.WAIT, sem=len(wait)))
                    if have[sem] < n:
                        steps.extend([wait[sem]] * (n - have[sem]))
                        have[sem] = n
            steps.append(m.step)
            for key in signals_after.get(i, ()):
                step = signals.get(key)
                if step is None:
                    step = signals[key] = Step(Op.SIGNAL, peer=key[0], sem=key[1])
                steps.append(step)
        ranks = []
        for r in range(self.nranks):
            scratch = max((n for n in self._scratch[r].values()), default=0) * self.k
            ranks.append(RankProgram(self.in_blocks * self.k, self.out_blocks * self.k, scratch, len(sems[r]),
                                     tuple(Lane(tuple(s)) for s in lanes[r])))
        plan = Plan(self.collective, self.nranks, tuple(ranks), name=self.name, in_blocks=self.in_blocks,
                    out_blocks=self.out_blocks)
        return validate(plan)
