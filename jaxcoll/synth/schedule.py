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
from collections.abc import Hashable, Iterator, Sequence

from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step, validate
from jaxcoll.synth.list_schedule import list_schedule


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
        self.lane_channel: list[int] = []  # lane id -> the channel its steps name (-1: none, the route)
        self._lane_ids: dict[tuple[int, Hashable], int] = {}
        # The moves, by id: the lane that runs each, its priority, its data step and the moves it depends on.
        self.move_lane: list[int] = []
        self.priority: list[tuple] = []
        self.step: list[Step] = []
        self.deps: list[Sequence[int]] = []
        self._scratch = [[0] * chunk_factor for _ in range(nranks)]  # rank -> position -> slots used

    def lane(self, rank: int, key: Hashable, peer: int | None = None, channel: int = -1) -> int:
        """The id of `rank`'s lane named `key`, whose moves all reach `peer` (None: they stay on `rank`) over
        `channel` (`Topology.route`; -1 names none: the route). A rank's lanes are numbered in the plan in order
        of repr(key)."""
        lane = self._lane_ids.get((rank, key))
        if lane is None:
            lane = self._lane_ids[rank, key] = len(self.lanes)
            self.lanes.append((rank, key, rank if peer is None else peer))
            self.lane_channel.append(channel)
        return lane

    def scratch(self, rank: int, position: int, count: int = 1) -> ChunkRef:
        """Fresh scratch chunks on `rank` at positions `position` .. `position + count - 1` (mod k) of a block,
        written once; the range must not cross a block boundary. Scratch is k-chunk slots per position: the range
        takes the first slot free at all its positions, so that it stays contiguous."""
        j = position % self.k
        used = self._scratch[rank]
        if count == 1:
            slot = used[j]
            used[j] = slot + 1
        else:
            slot = max(used[j:j + count])
            used[j:j + count] = [slot + 1] * count
        return ChunkRef.unchecked(rank, Buffer.SCRATCH, slot * self.k + j, count)

    def move(self, lane: int, priority: tuple, op: Op, srcs: tuple[ChunkRef, ...], dsts: tuple[ChunkRef, ...],
             deps: Sequence[int] = ()) -> int:
        """Add a data step run in lane `lane` (an id from `lane`); returns the move's id for later `deps`. The
        step is not checked here (`build` validates the plan): `op` is an `Op`, `srcs` and `dsts` tuples."""
        self.move_lane.append(lane)
        self.priority.append(priority)
        self.step.append(Step.unchecked(op, srcs, dsts, channel=self.lane_channel[lane]))
        self.deps.append(deps)
        return len(self.step) - 1

    def list_schedule(self, topology, chunk_bytes: float = 1 << 20, passes: str = "f") -> float:
        """Reorder every lane by greedy list scheduling: each lane is a server whose rate is its share of the
        links under max-min fair sharing when all lanes send at once (`jaxcoll.sim.max_min_rates`, the
        simulator's own rule); a free lane starts, among its moves whose inputs have landed, the one of smallest
        priority. Each move's priority becomes its position in the order of (start time, old priority), ties
        by id. A lane then never waits on a move whose inputs come later than those of a move behind it, which
        removes the head-of-line stalls of a fixed order. Dependencies start strictly earlier, so `build`'s
        deadlock argument still holds.

        `passes` is a string of directions, run in turn: "f" forwards as above, "b" backwards in time: from the
        moves nothing depends on, a move starts (in reversed time) once every move that uses it is done and its
        bytes have landed. A backward pass packs the end of the run the way a forward pass packs its start: a
        reduction in-tree is a broadcast out-tree run backwards, so "b" gives reduce_scatter the schedule that
        "f" gives all_gather (every link busy up to the end, the pipeline's fill at the start where the
        leaves' inputs are ready, instead of a drain that waits on whole subtrees). A pass after the first
        takes its order from the previous one: forwards by latest start, backwards by earliest finish (the
        forward-backward improvement of project scheduling), so "fbf" keeps the greedy start of "f" and ends
        with the moves that have least left to do downstream. A backward pass orders by (minus its reversed
        finish time, reversed old priority): a dependency finishes strictly later in reversed time, so it still
        comes first.

        "F" and "B" are the same passes at the links' shared rates: remote moves are transfers on the simulator's
        network (`jaxcoll.sim.sharing`), each at its max-min fair share among the transfers in flight at the
        time, so a lane gains the bandwidth that idle lanes leave (the fixed rates credit none of it, and
        in-trees, whose joins wait for their slowest child, drift from a fixed-rate schedule as the run goes
        on: dgx2x2 reduce_scatter at 1 GiB runs at 94.1% of the bound after "bfb", 99.4% after "bfbF", on the
        packing with headroom on its second routes; 93.0 and 98.1% on the exact one). A last
        "F" is the simulator's own run of its order, so the plan runs in the simulator as the pass did.

        Returns the last pass's makespan in seconds (the last bytes landed; with "F" last, the simulated time
        of the plan at chunks of `chunk_bytes`)."""
        return list_schedule(self, topology, chunk_bytes, passes)

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
        nlanes, nmoves = len(self.lanes), len(steps)
        sems = [0] * self.nranks
        stream_of: dict[int, int] = {}  # consumer lane * nlanes + producer lane -> stream id
        stream_rank: list[int] = []  # stream id -> the consumer's rank
        stream_sem: list[int] = []  # stream id -> its semaphore there
        # A signal is one stream signalled after one move; its ordinal (the count of the stream's signals up to
        # it) is known once its move is laid out, which comes before every move that waits for it.
        signal_stream: list[int] = []  # signal -> stream
        signals_after: list[list[int] | None] = [None] * nmoves  # move -> its signals, in order of first need
        waits_for: list[list[tuple[int, int]] | None] = [None] * nmoves  # move -> [(semaphore, signal)]
        for i in order:
            deps = deps_of[i]
            if not deps:
                continue
            li = move_lane[i]
            for d in deps:
                ld = move_lane[d]
                if ld == li:
                    continue
                key = li * nlanes + ld
                s = stream_of.get(key)
                if s is None:
                    r = lane_rank[li]
                    s = stream_of[key] = len(stream_sem)
                    stream_rank.append(r)
                    stream_sem.append(sems[r])
                    sems[r] += 1
                after = signals_after[d]
                if after is None:
                    after = signals_after[d] = []
                for signal in after:
                    if signal_stream[signal] == s:
                        break
                else:
                    signal = len(signal_stream)
                    signal_stream.append(s)
                    after.append(signal)
                if waits_for[i] is None:
                    waits_for[i] = []
                waits_for[i].append((stream_sem[s], signal))
        # Sync steps are immutable and identical wherever they name the same semaphore: build each once.
        waits = [[Step.unchecked(Op.WAIT, sem=s) for s in range(sems[r])] for r in range(self.nranks)]
        consumed = [[0] * sems[r] for r in range(self.nranks)]
        signal_step = [Step.unchecked(Op.SIGNAL, peer=r, sem=sem) for r, sem in zip(stream_rank, stream_sem)]
        issued = [0] * len(stream_sem)
        ordinal = [0] * len(signal_stream)
        lane_steps: list[list[Step]] = [[] for _ in range(nlanes)]
        for i in order:
            l = move_lane[i]
            out = lane_steps[l]
            need = waits_for[i]
            if need is not None:
                have, wait = consumed[lane_rank[l]], waits[lane_rank[l]]
                # by semaphore; of several waits on one semaphore, the last signal needed counts
                for sem, signal in (sorted(need) if len(need) > 1 else need):
                    n = ordinal[signal]
                    if have[sem] < n:
                        out.extend([wait[sem]] * (n - have[sem]))
                        have[sem] = n
            out.append(steps[i])
            after = signals_after[i]
            if after is not None:
                for signal in after:
                    s = signal_stream[signal]
                    issued[s] += 1
                    ordinal[signal] = issued[s]
                    out.append(signal_step[s])
        ranks = []
        for r in range(self.nranks):
            scratch = max(self._scratch[r], default=0) * self.k
            ranks.append(RankProgram(self.in_blocks * self.k, self.out_blocks * self.k, scratch, sems[r],
                                     tuple(Lane(tuple(lane_steps[l])) for l in rank_lanes[r])))
        plan = Plan(self.collective, self.nranks, tuple(ranks), name=self.name, in_blocks=self.in_blocks,
                    out_blocks=self.out_blocks)
        return validate(plan)
