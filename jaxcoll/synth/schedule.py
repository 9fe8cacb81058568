"""From a dependency graph of chunk moves to a plan: lanes, and the signals and waits that order them.

Synthesizers say *what* moves (a data step on some rank), in which lane of that rank it runs, its priority, and
which earlier moves it depends on. `Schedule.build` orders each lane by priority and turns every dependency that
crosses lanes into a semaphore: the producer's lane signals after its move, the consumer's lane waits before its
own. Semaphores are per (consumer lane, producer lane) stream, and a stream's signals are counted in the order
the producer issues them, so the consumer knows how many waits reach the signal it needs.

Deadlock freedom: a move's priority must exceed the priorities of its dependencies (`build` checks it). Every
lane runs in priority order, so by induction on priority every move finishes.

Plans of 16 ranks hold 30k-60k moves, so a move is kept as one entry in each of a few lists (its lane, priority,
step and dependencies) rather than as an object, and its step is built unchecked: `build` validates the plan.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
from collections.abc import Hashable, Iterator, Sequence

import numpy as np

from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step, validate


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a plan is built. A plan of 16 ranks is ~200k small objects
    (steps, refs, tuples) that form no cycles; allocating them sets off collections that scan the growing heap
    again and again, about half the building time, and free nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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
        self.lanes: list[tuple[int, Hashable, int]] = []  # lane id -> (rank, key, peer)
        self._lane_ids: dict[tuple[int, Hashable], int] = {}
        # The moves, by id: the lane that runs each, its priority, its data step and the moves it depends on.
        self.move_lane: list[int] = []
        self.priority: list[tuple] = []
        self.step: list[Step] = []
        self.deps: list[Sequence[int]] = []
        self._scratch = [[0] * chunk_factor for _ in range(nranks)]  # rank -> position -> slots used

    def lane(self, rank: int, key: Hashable, peer: int | None = None) -> int:
        """The id of `rank`'s lane named `key`, whose moves all reach `peer` (None: they stay on `rank`). A
        rank's lanes are numbered in the plan in order of repr(key)."""
        lane = self._lane_ids.get((rank, key))
        if lane is None:
            lane = self._lane_ids[rank, key] = len(self.lanes)
            self.lanes.append((rank, key, rank if peer is None else peer))
        return lane

    def scratch(self, rank: int, position: int) -> ChunkRef:
        """A fresh scratch chunk on `rank` at position `position` (mod k) of its block: written once."""
        j = position % self.k
        used = self._scratch[rank]
        slot = used[j]
        used[j] = slot + 1
        return ChunkRef.unchecked(rank, Buffer.SCRATCH, slot * self.k + j)

    def move(self, lane: int, priority: tuple, op: Op, srcs: tuple[ChunkRef, ...], dsts: tuple[ChunkRef, ...],
             deps: Sequence[int] = ()) -> int:
        """Add a data step run in lane `lane` (an id from `lane`); returns the move's id for later `deps`. The
        step is not checked here (`build` validates the plan): `op` is an `Op`, `srcs` and `dsts` tuples."""
        self.move_lane.append(lane)
        self.priority.append(priority)
        self.step.append(Step.unchecked(op, srcs, dsts))
        self.deps.append(deps)
        return len(self.step) - 1

    def list_schedule(self, topology, chunk_bytes: float = 1 << 20) -> None:
        """Reorder every lane by greedy list scheduling: each lane is a server whose rate is its share of the
        links under max-min fair sharing when all lanes send at once (`jaxcoll.sim.max_min_rates`, the
        simulator's own rule); a free lane starts, among its moves whose inputs have landed, the one of smallest
        priority. Each move's priority becomes (start time, rank of its old priority among all moves, ties by
        id): the order of (start time, old priority). A lane then never waits on a move whose inputs come later
        than those of a move behind it, which removes the head-of-line stalls of a fixed order. Dependencies
        start strictly earlier, so `build`'s deadlock argument still holds."""
        from jaxcoll.sim.engine import max_min_rates

        nmoves = len(self.step)
        lanes = sorted(set(self.move_lane), key=lambda l: repr(self.lanes[l][:2]))
        cap = np.array([l.bandwidth_GBps for l in topology.links])
        remote = [l for l in lanes if self.lanes[l][2] != self.lanes[l][0]]
        rate = [float(topology.memory_bandwidth_GBps or max(cap))] * len(self.lanes)
        latency = [0.0] * len(self.lanes)
        if remote:
            routes = [np.asarray(topology.route(*self.lanes[l][::2])) for l in remote]
            for l, x in zip(remote, max_min_rates(routes, cap)):
                rate[l] = float(x)
                latency[l] = topology.path_latency_us(*self.lanes[l][::2]) * 1e-6
        lane_Bps = [x * 1e9 for x in rate]
        local = [rank == peer for rank, _, peer in self.lanes]
        move_lane, deps_of = self.move_lane, self.deps
        # A local move reads each source from memory; a remote one is bound by its lane's share of the links.
        # Every ref of a step has the same chunk count (validate holds it).
        duration = [s.dsts[0].count * chunk_bytes / lane_Bps[l] * (len(s.srcs) if local[l] else 1)
                    for s, l in zip(self.step, move_lane)]
        # Lane queues hold each move's rank in priority order (ints compare faster than priority tuples).
        by_rank = sorted(range(nmoves), key=self.priority.__getitem__)  # stable: ties by id
        rank_of = [0] * nmoves
        for j, i in enumerate(by_rank):
            rank_of[i] = j
        users: list[list[int]] = [[] for _ in range(nmoves)]
        for i, deps in enumerate(deps_of):
            for d in deps:
                users[d].append(i)
        waiting = [len(deps) for deps in deps_of]
        ready_at = [0.0] * nmoves
        start = [0.0] * nmoves
        queue: list[list[int]] = [[] for _ in self.lanes]  # per lane: heap of ranks of moves whose inputs are in
        busy = [False] * len(self.lanes)
        # Events (time, order, x): x >= 0 is "move x's inputs arrive", x < 0 "lane ~x frees up". An idle lane's
        # queue is empty (it starts whatever arrives), so an arrival at an idle lane starts at once.
        events = [(0.0, i, i) for i in range(nmoves) if not deps_of[i]]
        seq = nmoves
        heapq.heapify(events)
        push, pop = heapq.heappush, heapq.heappop
        while events:
            now, _, x = pop(events)
            if x >= 0:
                l = move_lane[x]
                if busy[l]:
                    push(queue[l], rank_of[x])
                    continue
                i = x
            else:
                l = ~x
                if not queue[l]:
                    busy[l] = False
                    continue
                i = by_rank[pop(queue[l])]
            busy[l] = True
            start[i] = now
            done = now + duration[i]
            push(events, (done, seq, ~l))
            seq += 1
            arrive = done + latency[l]
            for u in users[i]:
                if ready_at[u] < arrive:
                    ready_at[u] = arrive
                waiting[u] -= 1
                if not waiting[u]:
                    push(events, (ready_at[u], seq, u))
                    seq += 1
        self.priority = list(zip(start, rank_of))

    def build(self) -> Plan:
        prio, deps_of, move_lane, steps = self.priority, self.deps, self.move_lane, self.step
        for i, deps in enumerate(deps_of):
            for d in deps:
                if not prio[d] < prio[i]:
                    raise AssertionError(f"move {i} {steps[i]!r} (priority {prio[i]}) depends on move {d} "
                                         f"{steps[d]!r} of priority {prio[d]}: not earlier")
        lane_rank = [rank for rank, _, _ in self.lanes]
        rank_lanes: list[list[int]] = [[] for _ in range(self.nranks)]
        for l in set(move_lane):
            rank_lanes[lane_rank[l]].append(l)
        for lanes in rank_lanes:
            lanes.sort(key=lambda l: repr(self.lanes[l][1]))
        order = sorted(range(len(steps)), key=prio.__getitem__)  # stable: ties by id
        # A stream is (consumer lane, producer lane); it gets a semaphore on the consumer's rank. All of a
        # stream's signals come from one producer lane, issued in priority order, so the n-th signal of a stream
        # is the n-th of its producer's moves (in priority order) that the consumer lane depends on.
        nlanes = len(self.lanes)
        sems = [0] * self.nranks
        stream_of: dict[int, int] = {}  # consumer lane * nlanes + producer lane -> stream id
        stream_sem: list[tuple[int, int]] = []  # stream id -> (consumer rank, semaphore there)
        signals_after: dict[int, list[int]] = {}  # move -> streams it signals, in order of first need
        waits_for: dict[int, list[tuple[int, int, int]]] = {}  # move -> [(semaphore, producer move, stream)]
        for i in order:
            deps = deps_of[i]
            if not deps:
                continue
            li = move_lane[i]
            for d in deps:
                ld = move_lane[d]
                if ld != li:
                    key = li * nlanes + ld
                    s = stream_of.get(key)
                    if s is None:
                        r = lane_rank[li]
                        s = stream_of[key] = len(stream_sem)
                        stream_sem.append((r, sems[r]))
                        sems[r] += 1
                    waits_for.setdefault(i, []).append((stream_sem[s][1], d, s))
                    after = signals_after.setdefault(d, [])
                    if s not in after:
                        after.append(s)
        # Sync steps are immutable and identical wherever they name the same semaphore: build each once.
        waits = [[Step.unchecked(Op.WAIT, sem=s) for s in range(sems[r])] for r in range(self.nranks)]
        consumed = [[0] * sems[r] for r in range(self.nranks)]
        signal = [Step.unchecked(Op.SIGNAL, peer=r, sem=sem) for r, sem in stream_sem]
        issued = [0] * len(stream_sem)
        ordinal: dict[int, list[int]] = {}  # move -> for each stream it signals, that signal's count
        lane_steps: list[list[Step]] = [[] for _ in range(nlanes)]
        for i in order:
            out = lane_steps[move_lane[i]]
            need = waits_for.get(i)
            if need is not None:
                r = lane_rank[move_lane[i]]
                have, wait = consumed[r], waits[r]
                need = [(sem, ordinal[d][signals_after[d].index(s)]) for sem, d, s in need]
                for sem, n in (sorted(need) if len(need) > 1 else need):
                    if have[sem] < n:
                        out.extend([wait[sem]] * (n - have[sem]))
                        have[sem] = n
            out.append(steps[i])
            after = signals_after.get(i)
            if after is not None:
                counts = ordinal[i] = []
                for s in after:
                    issued[s] += 1
                    counts.append(issued[s])
                    out.append(signal[s])
        ranks = []
        for r in range(self.nranks):
            scratch = max(self._scratch[r], default=0) * self.k
            ranks.append(RankProgram(self.in_blocks * self.k, self.out_blocks * self.k, scratch, sems[r],
                                     tuple(Lane(tuple(lane_steps[l])) for l in rank_lanes[r])))
        plan = Plan(self.collective, self.nranks, tuple(ranks), name=self.name, in_blocks=self.in_blocks,
                    out_blocks=self.out_blocks)
        return validate(plan)
