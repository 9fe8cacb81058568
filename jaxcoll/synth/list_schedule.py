"""Greedy list scheduling of a `Schedule`'s moves: the passes behind `Schedule.list_schedule` (whose docstring
states what they do and why).

Each lane is a server; a pass replays the moves as events in time (a move's inputs land, a lane frees up) and a
free lane starts, among its moves whose inputs have landed, the one that comes first in the pass's order. The
fixed-rate passes ("f", "b") give a lane its max-min fair share of the links when all lanes send at once; the
shared-rate passes ("F", "B") run remote moves as transfers on the simulator's network
(`jaxcoll.sim.sharing`), at the fair shares of the transfers in flight at the time.

Plans of 16 ranks hold 30k-60k moves and a pass handles every one of them, so a pass keeps its state in flat
lists indexed by move and lane, and binds what its loop reads to local names.
"""

from __future__ import annotations

from heapq import heappop, heappush

import numpy as np

from jaxcoll.sim.engine import local_passes
from jaxcoll.sim.sharing import Network, max_min_rates

PASSES = "fbFB"


class Moves:
    """What list scheduling needs of a Schedule's moves: each move's lane, duration at its lane's fixed rate,
    bytes and local work (for the shared-rate passes), the moves that wait for it, and the rank of its
    priority; each lane's route latency."""

    def __init__(self, sched, topology, chunk_bytes: float, shared: bool):
        self.sched, self.topology = sched, topology
        self.lane = sched.move_lane
        self.deps = sched.deps
        n = len(sched.step)
        lane_Bps, self.latency = lane_rates(sched, topology)
        local = [rank == peer for rank, _, peer in sched.lanes]
        # A local move reads each source from memory; a remote one is bound by its lane's share of the links.
        # Every ref of a step has the same chunk count (validate holds it).
        self.duration = [s.dsts[0].count * chunk_bytes / lane_Bps[l] * (len(s.srcs) if local[l] else 1)
                         for s, l in zip(sched.step, self.lane)]
        self.nbytes = [s.dsts[0].count * chunk_bytes for s in sched.step]
        self.work = local_work(sched, topology, self.nbytes) if shared else [0.0] * n
        self.slack = 1e-9 * max(1.0, chunk_bytes)  # as the simulator's: transfers that end together
        # Orders are ranks: lane queues compare ints, faster than priority tuples. `old` is the rank of each
        # move's priority, ties by id.
        self.old = np.empty(n, dtype=np.int64)
        self.old[sorted(range(n), key=sched.priority.__getitem__)] = np.arange(n)
        self.users: list[list[int]] = [[] for _ in range(n)]
        for i, deps in enumerate(self.deps):
            for d in deps:
                self.users[d].append(i)

    def __len__(self) -> int:
        return len(self.lane)


def lane_rates(sched, topology) -> tuple[list[float], list[float]]:
    """(bytes per second, route latency in seconds) of every lane: a remote lane gets its max-min fair share of
    the links when every remote lane sends at once (`jaxcoll.sim.max_min_rates`, the simulator's own rule); a
    local one the memory bandwidth (or, without one, the fastest link's)."""
    cap = np.array([link.bandwidth_GBps for link in topology.links])
    used = sorted(set(sched.move_lane), key=lambda l: repr(sched.lanes[l][:2]))
    remote = [l for l in used if sched.lanes[l][2] != sched.lanes[l][0]]
    rate = [float(topology.memory_bandwidth_GBps or max(cap))] * len(sched.lanes)
    latency = [0.0] * len(sched.lanes)
    if remote:
        routes = [np.asarray(topology.route(*sched.lanes[l][::2], sched.lane_channel[l])) for l in remote]
        for l, x in zip(remote, max_min_rates(routes, cap)):
            rate[l] = float(x)
            latency[l] = topology.path_latency_us(*sched.lanes[l][::2], sched.lane_channel[l]) * 1e-6
    return [x * 1e9 for x in rate], latency


def local_work(sched, topology, nbytes: list[float]) -> list[float]:
    """Seconds of local memory work of every move, as the simulator charges it (`local_passes`); none without
    a memory bandwidth."""
    mem = float(topology.memory_bandwidth_GBps or 0) * 1e9
    if not mem:
        return [0.0] * len(nbytes)
    work = []
    for s, l, b in zip(sched.step, sched.move_lane, nbytes):
        rank = sched.lanes[l][0]
        remote_srcs = sum(ref.rank != rank for ref in s.srcs)
        local_dsts = sum(ref.rank == rank for ref in s.dsts)
        work.append(local_passes(len(s.srcs), remote_srcs, local_dsts) * b / mem)
    return work


class Pass:
    """One pass of list scheduling, forwards in time or (`reverse`) backwards: among ready moves a lane starts
    the one that comes first in `order` (a permutation of the moves). With `shared`, remote moves are
    transfers on the simulator's network at the fair rates of the transfers in flight, and local work costs
    what the simulator charges.

    Events by time: `at[t]` lists the events of time t in the order they were issued, x >= 0 for "move x's
    inputs arrive" and x < 0 for "lane ~x frees up"; `times` is a heap of the times that have events (a heap of
    (time, order, x) tuples would do the same at twice the cost). An idle lane's queue is empty (it starts
    whatever arrives), so an arrival at an idle lane starts at once."""

    def __init__(self, moves: Moves, order: np.ndarray, reverse: bool, shared: bool):
        self.moves, self.reverse = moves, reverse
        self.move_lane, self.latency = moves.lane, moves.latency
        n, lanes = len(moves), moves.sched.lanes
        self.by_rank = order.tolist()
        self.rank_of = [0] * n
        for j, i in enumerate(self.by_rank):
            self.rank_of[i] = j
        self.after = moves.deps if reverse else moves.users  # the moves that wait for a move
        self.waiting = [len(u) for u in moves.users] if reverse else [len(deps) for deps in moves.deps]
        self.ready_at = [0.0] * n
        self.start = [0.0] * n
        self.finish = list(moves.duration)  # a move's end (fixed rates: its start plus this)
        self.queue: list[list[int]] = [[] for _ in lanes]  # per lane: heap of ranks of moves whose inputs are in
        self.busy = [False] * len(lanes)
        self.net = None
        self.route = [-1] * len(lanes)  # a lane's route on `net`; -1: its moves take their `finish` as they are
        if shared:
            self.net = Network(moves.topology)
            self.route = [self.net.route(rank, peer, moves.sched.lane_channel[l]) if rank != peer else -1
                          for l, (rank, _, peer) in enumerate(lanes)]
            self.finish = list(moves.work)
        self.at = {0.0: [i for i in self.by_rank if not self.waiting[i]]}
        self.times = [0.0]

    def run(self) -> tuple[list[float], list[float]]:
        """(start, finish) of every move (in reversed time for a backward pass)."""
        at, times = self.at, self.times
        move_lane, busy, queue, rank_of, by_rank = self.moves.lane, self.busy, self.queue, self.rank_of, self.by_rank
        start, finish, route, net, done = self.start, self.finish, self.route, self.net, self.done
        now = 0.0
        while True:
            t_flow = self.next_transfer_end(now) if net is not None else None
            if t_flow is not None:
                now = max(now, t_flow)
                for f in net.finish(now, self.moves.slack):
                    i = f.owner
                    finish[i] = max(now, start[i] + self.moves.work[i])
                    done(i, finish[i])
                continue
            if not times:
                return start, finish
            now = heappop(times)
            for x in at[now]:  # events of time `now` issued on the way are appended, and run in turn
                if x >= 0:
                    l = move_lane[x]
                    if busy[l]:
                        heappush(queue[l], rank_of[x])
                        continue
                    i = x
                else:
                    l = ~x
                    if not queue[l]:
                        busy[l] = False
                        continue
                    i = by_rank[heappop(queue[l])]
                busy[l] = True
                start[i] = now
                if route[l] >= 0:
                    net.start(route[l], self.moves.nbytes[i], i, now)
                else:
                    finish[i] += now
                    done(i, finish[i])
            del at[now]

    def next_transfer_end(self, now: float) -> float | None:
        """When the next transfer on the network ends, if that comes before (or with) the next event (None
        otherwise): then its lane goes on once the move's local work is done too (a reduce_put streams its
        sources while it sends)."""
        self.net.reshare(now)
        t_flow = self.net.next_finish()
        return t_flow if t_flow < float("inf") and (not self.times or t_flow <= self.times[0]) else None

    def done(self, i: int, t: float) -> None:
        """Move i ends at t: its lane frees up, and the moves waiting for it have its bytes one route latency
        later (in reversed time the put is the user). The events are filed here directly, not through a
        helper: this runs once a move, in the fixed-rate passes' hot loop."""
        at = self.at
        move_lane = self.move_lane
        latency = self.latency
        ready_at = self.ready_at
        waiting = self.waiting
        reverse = self.reverse
        l = move_lane[i]
        events = at.get(t)
        if events is None:
            at[t] = [~l]
            heappush(self.times, t)
        else:
            events.append(~l)
        for u in self.after[i]:
            arrive = t + latency[move_lane[u] if reverse else l]
            if ready_at[u] < arrive:
                ready_at[u] = arrive
            waiting[u] -= 1
            if not waiting[u]:
                t_u = ready_at[u]
                events = at.get(t_u)
                if events is None:
                    at[t_u] = [u]
                    heappush(self.times, t_u)
                else:
                    events.append(u)


def list_schedule(sched, topology, chunk_bytes: float, passes: str) -> float:
    """Run `passes` over the moves of `sched` and set their priorities to the order of the last one; return its
    makespan (see `Schedule.list_schedule`)."""
    if not passes or set(passes) - set(PASSES):
        raise ValueError(f"list_schedule passes are 'f', 'b', 'F' or 'B', got {passes!r}")
    moves = Moves(sched, topology, chunk_bytes, shared=bool(set(passes) & set("FB")))
    old = moves.old
    time = None  # forward-time order of the previous pass: smaller is earlier
    span = np.asarray(moves.duration)  # each move's duration in the previous pass
    finish: list[float] = list(moves.duration)
    for direction in passes:
        shared = direction in "FB"
        if direction in "fF":
            start, finish = Pass(moves, np.lexsort((old,) if time is None else (old, time)), False, shared).run()
            time = np.asarray(start)
        else:
            # reversed time runs from the end: moves that finish last go first
            order = np.lexsort((-old,) if time is None else (-old, -(time + span)))
            start, finish = Pass(moves, order, True, shared).run()
            time = -np.asarray(finish)
        span = np.asarray(finish) - np.asarray(start)
    position = np.empty(len(moves), dtype=np.int64)
    position[np.lexsort((old, time))] = np.arange(len(moves))
    sched.priority = position.tolist()
    # the run ends when the last bytes have landed
    return max((t + moves.latency[l] for t, l in zip(finish, moves.lane)), default=0.0)
