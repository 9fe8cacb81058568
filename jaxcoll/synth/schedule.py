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

    def list_schedule(self, topology, chunk_bytes: float = 1 << 20) -> None:
        """Reorder every lane by greedy list scheduling: each lane is a server whose rate is its share of the
        links under max-min fair sharing when all lanes send at once (`jaxcoll.sim.max_min_rates`, the
        simulator's own rule); a free lane starts, among its moves whose inputs have landed, the one of smallest
        priority. Each move's priority becomes (start time, old priority). A lane then never waits on a move
        whose inputs come later than those of a move behind it, which removes the head-of-line stalls of a
        fixed order. Dependencies start strictly earlier, so `build`'s deadlock argument still holds."""
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
        users: dict[int, list[int]] = {}
        waiting = [len(m.deps) for m in moves]
        ready_at = [0.0] * len(moves)
        for i, m in enumerate(moves):
            for d in m.deps:
                users.setdefault(d, []).append(i)
        queue: list[list] = [[] for _ in lanes]  # per lane: heap of (priority, move) whose inputs are there
        free_at = [0.0] * len(lanes)
        events: list = []  # (time, order, kind, x): kind 0 = a move's inputs arrive, 1 = a lane frees up
        seq = 0
        for i, m in enumerate(moves):
            if not m.deps:
                events.append((0.0, seq, 0, i))
                seq += 1
        heapq.heapify(events)
        idle = [True] * len(lanes)
        start = [0.0] * len(moves)
        while events:
            now, _, kind, x = heapq.heappop(events)
            if kind == 0:
                l = lane_id[moves[x].rank, moves[x].lane]
                heapq.heappush(queue[l], (moves[x].priority, x))
            else:
                l = x
                idle[l] = True
            if idle[l] and queue[l]:
                _, i = heapq.heappop(queue[l])
                idle[l] = False
                start[i] = now
                m = moves[i]
                size = max(ref.count for ref in (*m.step.srcs, *m.step.dsts))
                done = now + size * chunk_bytes / (rate[l] * 1e9) * (len(m.step.srcs) if peer[i] == m.rank else 1)
                heapq.heappush(events, (done, seq, 1, l))
                seq += 1
                for u in users.get(i, ()):
                    ready_at[u] = max(ready_at[u], done + latency[l])
                    waiting[u] -= 1
                    if not waiting[u]:
                        heapq.heappush(events, (ready_at[u], seq, 0, u))
                        seq += 1
        for i, m in enumerate(moves):
            m.priority = (start[i], m.priority)

    def build(self) -> Plan:
        moves = self.moves
        for i, m in enumerate(moves):
            for d in m.deps:
                if not moves[d].priority < m.priority:
                    raise AssertionError(f"move {i} {m.step!r} (priority {m.priority}) depends on move {d} "
                                         f"{moves[d].step!r} of priority {moves[d].priority}: not earlier")
        lane_keys = [sorted({m.lane for m in moves if m.rank == r}, key=repr) for r in range(self.nranks)]
        lane_of = [{key: i for i, key in enumerate(keys)} for keys in lane_keys]
        order = sorted(range(len(moves)), key=lambda i: (moves[i].priority, i))
        where = {i: (moves[i].rank, lane_of[moves[i].rank][moves[i].lane]) for i in range(len(moves))}
        # A stream is (consumer lane, producer lane); it gets a semaphore on the consumer's rank. All of a
        # stream's signals come from one producer lane, issued in priority order, so the n-th signal of a stream
        # is the n-th of its producer's moves (in priority order) that the consumer lane depends on.
        sems: list[dict] = [{} for _ in range(self.nranks)]
        signals_after: dict[int, list[tuple[int, int]]] = defaultdict(list)  # move -> [(peer, sem)]
        for i in order:
            m = moves[i]
            for d in m.deps:
                if where[d] != where[i]:
                    sem = sems[m.rank].setdefault((where[i], where[d]), len(sems[m.rank]))
                    if (m.rank, sem) not in signals_after[d]:
                        signals_after[d].append((m.rank, sem))
        ordinal: dict[tuple[int, int, int], int] = {}
        issued: dict[tuple[int, int], int] = defaultdict(int)
        for d in order:
            for peer, sem in signals_after.get(d, ()):
                issued[peer, sem] += 1
                ordinal[d, peer, sem] = issued[peer, sem]
        needs: dict[int, list[tuple[int, int]]] = defaultdict(list)  # move -> [(sem, signal number)]
        for i in order:
            m = moves[i]
            for d in m.deps:
                if where[d] != where[i]:
                    sem = sems[m.rank][(where[i], where[d])]
                    needs[i].append((sem, ordinal[d, m.rank, sem]))
        lanes: list[list[list[Step]]] = [[[] for _ in keys] for keys in lane_keys]
        consumed: dict[tuple[int, int], int] = defaultdict(int)
        for i in order:
            m = moves[i]
            r, l = where[i]
            steps = lanes[r][l]
            for sem, n in sorted(needs.get(i, ())):
                while consumed[r, sem] < n:
                    steps.append(Step(Op.WAIT, sem=sem))
                    consumed[r, sem] += 1
            steps.append(m.step)
            for peer, sem in signals_after.get(i, ()):
                steps.append(Step(Op.SIGNAL, peer=peer, sem=sem))
        ranks = []
        for r in range(self.nranks):
            scratch = max((n for n in self._scratch[r].values()), default=0) * self.k
            ranks.append(RankProgram(self.in_blocks * self.k, self.out_blocks * self.k, scratch, len(sems[r]),
                                     tuple(Lane(tuple(s)) for s in lanes[r])))
        plan = Plan(self.collective, self.nranks, tuple(ranks), name=self.name, in_blocks=self.in_blocks,
                    out_blocks=self.out_blocks)
        return validate(plan)
