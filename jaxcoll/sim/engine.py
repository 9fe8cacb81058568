"""Event simulation of a plan on a topology: how long the plan takes for a message of `nbytes`.

The model (docs/synthesis.md, "The simulator"):
- Every lane of every rank runs its steps in order, from time 0 (the executor's entry rendezvous).
- A data step that names a chunk on a peer is a *transfer* along `Topology.route` of the step's channel (-1, none
  named, is channel 0: the lowest-latency route; channel 1 the pair's alternative path; a channel the pair has no
  route for, as a language plan's parallel connections, takes channel 0): a put (a remote destination)
  sends from this rank, a get or read_reduce (a remote source) pulls to it. While transfers are in flight the
  links are shared max-min fairly (progressive filling): each transfer gets an equal share of its bottleneck
  link, and what one transfer cannot use goes to the others (`jaxcoll.sim.sharing`, which recomputes only what
  a start or finish touches). A lane that puts goes on when its last byte has left (the transfer time); the
  bytes land `latency` later (the sum of the route's link latencies). A lane that pulls goes on when its bytes
  have landed.
- A signal reaches its peer one route latency after it is issued; it follows the puts the lane issued before it
  (release order), so a waiter never sees a signal before the data. A wait blocks until a signal is there.
  A barrier holds every lane of the rank until all have reached it.
- Local work (a local copy, or a reduction of several chunks) streams through the rank's memory:
  (sources read + local destinations written) x bytes / `Topology.memory_bandwidth_GBps`; free when the topology
  has none. A plain put or get streams at the link's rate and adds no local cost.
  A reduce_put streams (reads its sources and sends the sum as it goes): it takes the longer of the two; a
  read_reduce receives first, then reduces.
- The plan ends when every lane has finished and every byte and signal has landed (the exit barrier).

Under this model a ring all_reduce on N ranks joined by links of bandwidth B and latency alpha takes exactly
2(N-1) alpha + 2(N-1)/N S/B, the textbook alpha-beta cost; tests/test_sim.py checks it and the other closed forms.
"""

from __future__ import annotations

import heapq
from collections import defaultdict

from jaxcoll.plan import Buffer, Op, Plan
from jaxcoll.sim.sharing import Network, max_min_rates  # noqa: F401 (max_min_rates: synthesis imports it here)
from jaxcoll.topology import Topology

# An enum member read off its class goes through a descriptor (~10x a global read), and every step is tested.
_WAIT, _SIGNAL, _BARRIER = Op.WAIT, Op.SIGNAL, Op.BARRIER


class SimulationError(RuntimeError):
    """The plan cannot run to completion on the topology (a wait that no signal satisfies)."""


def local_passes(nsrc: int, remote_srcs: int, local_dsts: int) -> int:
    """How many times a data step streams its chunk through its rank's memory, from how many sources it has, how
    many of them are on peers and how many of its destinations are local: a reduction reads every source, a
    local copy reads its source, and each local destination is written; a plain put or get streams at the
    link's rate and costs none. Local work takes this times the chunk's bytes over
    `Topology.memory_bandwidth_GBps` (the list schedule's shared-rate passes charge the same)."""
    reads = nsrc if nsrc > 1 or (local_dsts and not remote_srcs) else 0
    return reads + local_dsts if reads or nsrc > 1 else 0


def chunk_bytes(plan: Plan, nbytes: float) -> float:
    """Bytes of one chunk when the collective moves `nbytes` (nccl-tests' S: the all_reduce buffer, the
    all_gather output, the reduce_scatter input)."""
    return float(nbytes) / max(plan.in_blocks, plan.out_blocks) / plan.chunk_factor


def simulate(plan: Plan, topology: Topology, nbytes: float, trace: list | None = None, *,
             requested_pulls: bool = False) -> float:
    """Seconds the plan takes on the topology for a message of `nbytes` (see the module docstring for the
    model). If `trace` is a list, (start, end, rank, lane, step) tuples of data steps are appended to it.
    `requested_pulls`: a pull's bytes land a route latency later than by default, for transports that answer a
    get with a message (the request's trip), as jaxcoll's network transport does, where a GPU's load from peer
    memory does not."""
    if plan.nranks != topology.nranks:
        raise ValueError(f"plan is for nranks={plan.nranks} but topology {topology.name!r} has "
                         f"{topology.nranks} ranks")
    return _Simulation(plan, topology, nbytes, trace, 2.0 if requested_pulls else 1.0).run()


class _Simulation:
    def __init__(self, plan: Plan, topo: Topology, nbytes: float, trace, pull_trips: float = 1.0):
        self.plan, self.topo, self.trace = plan, topo, trace
        self.pull_trips = pull_trips  # route latencies a pull waits for its bytes: 2 when a request goes first
        self.chunk = chunk_bytes(plan, nbytes)
        # A transfer within this many bytes of done when another finishes finishes with it (floating error of
        # transfers that end together).
        self.slack = 1e-9 * max(1.0, self.chunk)
        self.mem = topo.memory_bandwidth_GBps * 1e9 if topo.memory_bandwidth_GBps else None
        self.net = Network(topo)
        self.lanes = [[lane.steps for lane in prog.lanes] for prog in plan.ranks]
        self.pc = [[0] * len(prog.lanes) for prog in plan.ranks]
        self.sems = [defaultdict(int) for _ in plan.ranks]
        self.waiting: dict[tuple[int, int], tuple[int, int]] = {}  # (rank, sem) -> (rank, lane) blocked on it
        self.barrier: list[dict[int, list]] = [defaultdict(list) for _ in plan.ranks]
        self.barrier_seen = [[0] * len(prog.lanes) for prog in plan.ranks]
        self.events: list = []
        self.seq = 0
        self.pending: dict[tuple[int, int], list] = {}  # (rank, lane) -> [flows left, resume delay, start]
        self.now = 0.0
        self.end = 0.0

    def push(self, t: float, kind: str, payload) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    # -- main loop -------------------------------------------------------------------------------------------
    def run(self) -> float:
        for r, lanes in enumerate(self.lanes):
            for l in range(len(lanes)):
                self.push(0.0, "lane", (r, l))
        net, events = self.net, self.events
        while True:
            # every event at this instant (after the transfers that finished at it), then one rate computation
            while events and events[0][0] <= self.now:
                _, _, kind, payload = heapq.heappop(events)
                if kind == "lane":
                    self.advance(*payload)
                else:  # a signal lands
                    r, sem = payload
                    self.sems[r][sem] += 1
                    self.end = max(self.end, self.now)
                    blocked = self.waiting.pop((r, sem), None)
                    if blocked is not None:
                        self.advance(*blocked)
            net.reshare(self.now)
            t_event = events[0][0] if events else float("inf")
            t_flow = net.next_finish()
            if t_flow <= t_event and t_flow < float("inf"):
                # max(): a finish time computed a few ulps before `now` (its transfer's rate changed at `now`)
                self.now = max(self.now, t_flow)
                for f in net.finish(self.now, self.slack):
                    self.end = max(self.end, self.now + f.latency)
                    entry = self.pending[f.owner]
                    entry[0] -= 1
                    entry[1] = max(entry[1], self.pull_trips * f.latency if entry[3] else 0.0)
                    if entry[0] == 0:
                        del self.pending[f.owner]
                        self.push(max(self.now + entry[1] + entry[2], entry[4]), "lane", f.owner)
            elif t_event < float("inf"):
                self.now = t_event
            else:
                break
        stuck = [(r, l) for r, lanes in enumerate(self.lanes) for l, steps in enumerate(lanes)
                 if self.pc[r][l] < len(steps)]
        if stuck:
            r, l = stuck[0]
            raise SimulationError(f"plan {self.plan.name!r} never finishes: rank {r} lane {l} is stuck at step "
                                  f"{self.pc[r][l]} ({self.lanes[r][l][self.pc[r][l]]!r}) and "
                                  f"{len(stuck) - 1} other lanes too")
        return self.end

    def advance(self, r: int, l: int) -> None:
        """Run lane (r, l) from its current step until it blocks, starts a transfer or finishes."""
        steps = self.lanes[r][l]
        pc, sems = self.pc[r], self.sems[r]
        while pc[l] < len(steps):
            step = steps[pc[l]]
            op = step.op
            if op is _WAIT:
                if sems[step.sem] > 0:
                    sems[step.sem] -= 1
                    pc[l] += 1
                    continue
                self.waiting[r, step.sem] = (r, l)
                return
            if op is _SIGNAL:
                latency = self.net.latency(r, step.peer) if step.peer != r else 0.0
                self.push(self.now + latency, "signal", (step.peer, step.sem))
                pc[l] += 1
                continue
            if op is _BARRIER:
                k = self.barrier_seen[r][l]
                self.barrier_seen[r][l] += 1
                pc[l] += 1
                arrived = self.barrier[r][k]
                arrived.append(l)
                if len(arrived) < len(self.lanes[r]):
                    return
                for other in arrived:
                    if other != l:
                        self.push(self.now, "lane", (r, other))
                continue
            pc[l] += 1
            self.start_data(r, l, step)
            return
        self.end = max(self.end, self.now)

    def start_data(self, r: int, l: int, step) -> None:
        nbytes = self.chunk * step.srcs[0].count if step.srcs else self.chunk * step.dsts[0].count
        remote_srcs = [ref for ref in step.srcs if ref.rank != r]
        remote_dsts = [ref for ref in step.dsts if ref.rank != r]
        passes = local_passes(len(step.srcs), len(remote_srcs), len(step.dsts) - len(remote_dsts))
        compute = passes * nbytes / self.mem if self.mem else 0.0
        if self.trace is not None:
            self.trace.append((self.now, r, l, step))
        if not remote_srcs and not remote_dsts:
            self.push(self.now + compute, "lane", (r, l))
            return
        pulls = bool(remote_srcs)
        flows = [(ref.rank, r) for ref in remote_srcs] + [(r, ref.rank) for ref in remote_dsts]
        # [transfers left, landing delay the lane waits for (pulls only), local work after, pulls?, earliest
        # finish]. A reduce_put streams: it reads its sources and sends their sum as it goes (the point of the
        # fused step), so the lane finishes when both the sending and the reading are done.
        owner = (r, l)
        self.pending[owner] = [len(flows), 0.0, compute if pulls else 0.0, pulls,
                               0.0 if pulls else self.now + compute]
        net = self.net
        channel = step.channel
        for a, b in flows:
            net.start(net.route(a, b, channel), nbytes, owner, self.now)
