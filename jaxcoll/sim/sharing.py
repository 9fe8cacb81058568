"""Link sharing: the transfers in flight on a topology's links and their max-min fair rates.

The simulator (`jaxcoll.sim.engine`) starts a transfer when a data step reaches a peer and asks here when the next
one finishes. Rates follow progressive filling: raise every transfer's rate together; when a link fills, freeze
the transfers that cross it at that level. The allocation is unique, so it can be computed piecewise:

- Transfers that share no link, even transitively, do not affect each other: when transfers start or finish,
  only the connected component of the links they touch is refilled, never the whole network.
- Transfers along the same route get the same rate, so a component is a set of routes with counts; a plan repeats
  the same few of them many times, so the rates of each (routes, counts) set are computed once and looked up after.
  The same holds for the whole network: the counts of transfers per route, seen before, give every rate without
  finding the component at all.
- A transfer's bytes left are brought up to date only when its rate changes, and its finish time sits in a heap:
  work per event is that of the transfers whose rate changed, not of everything in flight.

`max_min_rates` is the same rule for one large set of flows at once (numpy), as synthesis uses it.
"""

from __future__ import annotations

import heapq
from array import array
from itertools import compress
from operator import itemgetter, ne

import numpy as np

from jaxcoll.topology import Topology

# A link fills "at the same level" as the bottleneck within this relative tolerance (floating error of the
# subtractions of earlier levels), so that equal shares freeze together.
_TIE = 1e-12
# Memory for remembered rates (of components and of whole-network states); past it they start over, which bounds
# what long simulations of large plans hold.
_MEMO_BYTES = 128 << 20


def max_min_rates(flow_links, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows that cross the given links (arrays of link indices), by progressive filling:
    raise every unfrozen flow's rate together; when a link fills, freeze the flows that cross it."""
    lens = np.fromiter((len(l) for l in flow_links), dtype=np.int64, count=len(flow_links))
    links = np.concatenate(flow_links).astype(np.int64)
    owner = np.repeat(np.arange(len(flow_links)), lens)
    remaining = np.array(capacity, dtype=float)
    rate = np.zeros(len(flow_links))
    active = np.ones(len(flow_links), dtype=bool)
    while active.any():
        on = active[owner]
        counts = np.bincount(links[on], minlength=len(remaining))
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(counts > 0, remaining / np.maximum(counts, 1), np.inf)
        s = share.min()
        bottleneck = share <= s * (1 + _TIE)
        frozen = np.zeros(len(flow_links), dtype=bool)
        frozen[owner[on & bottleneck[links]]] = True
        frozen &= active
        rate[frozen] = s
        np.subtract.at(remaining, links[frozen[owner]], s)
        active &= ~frozen
    return rate


def fair_route_rates(route_links, counts, capacity) -> list[float]:
    """Max-min fair rate of each transfer when `counts[i]` transfers follow route `route_links[i]` (a sequence of
    link indices into `capacity`), by progressive filling as `max_min_rates`. Plain Python: a component is a
    handful of routes, where numpy's per-call cost would dominate."""
    remaining: dict[int, float] = {}
    users: dict[int, int] = {}  # link -> unfrozen transfers crossing it
    crossing: dict[int, list[int]] = {}  # link -> routes crossing it
    for i, (links, c) in enumerate(zip(route_links, counts)):
        for l in links:
            if l in users:
                users[l] += c
                crossing[l].append(i)
            else:
                users[l] = c
                remaining[l] = capacity[l]
                crossing[l] = [i]
    rate: list[float | None] = [None] * len(route_links)
    left = len(route_links)
    while left:
        share = {l: remaining[l] / c for l, c in users.items() if c > 0}
        s = min(share.values())
        limit = s * (1 + _TIE)
        for l, x in share.items():
            if x > limit:
                continue
            for i in crossing[l]:
                if rate[i] is None:
                    rate[i] = s
                    left -= 1
                    c = counts[i]
                    for k in route_links[i]:
                        remaining[k] -= s * c
                        users[k] -= c
    return rate


class Flow:
    """One transfer in flight: `remaining` bytes left at time `since`, moving at `rate` since then."""

    __slots__ = ("id", "route", "remaining", "since", "rate", "owner", "latency", "version")

    def __init__(self, id: int, route: int, nbytes: float, now: float, rate: float, owner, latency: float):
        self.id, self.route, self.remaining, self.since, self.rate = id, route, nbytes, now, rate
        self.owner, self.latency = owner, latency
        self.version = 0  # of its entry in the finish heap: 0 before it has one, -1 once finished

    def left_at(self, now: float) -> float:
        return self.remaining - self.rate * (now - self.since)


class Network:
    """The transfers in flight on `topology`'s links. `start` adds transfers and `finish` removes those done;
    `reshare` (after a batch of either, at one instant) gives the touched components their new rates;
    `next_finish` is when the first transfer in flight will be done."""

    def __init__(self, topology: Topology):
        self.topo = topology
        self.capacity = [l.bandwidth_GBps * 1e9 for l in topology.links]
        self.route_of: dict[tuple[int, int], int] = {}
        self.route_links: list[tuple[int, ...]] = []
        self.route_latency: list[float] = []
        self.route_flows: list[dict[int, Flow]] = []  # in flight, by id (start order)
        self.route_rate: list[float] = []
        self.link_routes: list[dict[int, None]] = [{} for _ in topology.links]  # routes in flight, start order
        self.finishes: list = []  # heap of (finish time, flow id, version, flow)
        self.touched: list[int] = []  # routes whose transfers started or finished since the last reshare
        self.started: list[Flow] = []
        self.count = array("H")  # transfers in flight per route; .tobytes() is a cheap key of the whole state
        self.rates: dict[bytes, list[float]] = {}  # a component's routes and counts -> the routes' rates
        self.states: dict[bytes, tuple] = {}  # `count` -> (routes in flight, a getter of their rates, rates)
        self.memo_bytes = 0
        self.ids = 0

    def route(self, a: int, b: int, channel: int = -1) -> int:
        """Id of the route from rank a to rank b on `channel` (`Topology.route`; -1 and 0 are the same route). A
        channel beyond the pair's routes (`Topology.channels`: a plan's parallel connections, as the language
        numbers them) takes the route of channel 0."""
        key = (a, b) if channel <= 0 else (a, b, channel)
        r = self.route_of.get(key)
        if r is None and channel > 0 and channel >= self.topo.channels(a, b) > 0:
            r = self.route_of[key] = self.route(a, b)
        if r is None:
            links = tuple(self.topo.route(a, b, channel))
            r = self.route_of[key] = len(self.route_links)
            self.route_links.append(links)
            self.route_latency.append(sum(self.topo.links[i].latency_us for i in links) * 1e-6)
            self.route_flows.append({})
            self.route_rate.append(0.0)
            self.count.append(0)
        return r

    def latency(self, a: int, b: int) -> float:
        return self.route_latency[self.route(a, b)]

    def start(self, route: int, nbytes: float, owner, now: float) -> Flow:
        f = Flow(self.ids, route, nbytes, now, self.route_rate[route], owner, self.route_latency[route])
        self.ids += 1
        flows = self.route_flows[route]
        if not flows:
            for l in self.route_links[route]:
                self.link_routes[l][route] = None
        flows[f.id] = f
        self.count[route] += 1
        self.touched.append(route)
        self.started.append(f)
        return f

    def next_finish(self) -> float:
        heap = self.finishes
        while heap and heap[0][2] != heap[0][3].version:
            heapq.heappop(heap)  # the flow's rate changed since: a later entry holds its finish
        return heap[0][0] if heap else float("inf")

    def finish(self, now: float, slack: float) -> list[Flow]:
        """Remove the transfers done at `now` (call when `now` is `next_finish()`): the first in the heap and the
        ones after it in finish order that are within `slack` bytes of done; returned in start order."""
        heap = self.finishes
        done = [heapq.heappop(heap)[3]]
        while heap:
            _, _, version, f = heap[0]
            if version == f.version and f.left_at(now) > slack:
                break
            heapq.heappop(heap)
            if version == f.version:
                done.append(f)
        done.sort(key=lambda f: f.id)
        for f in done:
            flows = self.route_flows[f.route]
            del flows[f.id]
            f.version = -1  # any heap entry left is stale
            if not flows:
                for l in self.route_links[f.route]:
                    del self.link_routes[l][f.route]
            self.count[f.route] -= 1
            self.touched.append(f.route)
        return done

    def reshare(self, now: float) -> None:
        """New rates for the components touched since the last call; transfers whose rate changes are brought
        up to `now` and get a new finish time."""
        if not self.touched:
            return
        state = self.count.tobytes()
        known = self.states.get(state)
        if known is None:
            component = sorted(self._component(self.touched))
            if component:
                counts = [self.count[r] for r in component]
                key = array("H", component + counts).tobytes()
                rates = self.rates.get(key)
                if rates is None:
                    rates = fair_route_rates([self.route_links[r] for r in component], counts, self.capacity)
                    self._remember(self.rates, key, rates, len(component))
                self._set_rates(component, rates, now)
            routes = list(compress(range(len(self.count)), self.count))
            # itemgetter, map and compress run in C: on a hit, finding the few routes whose rate changes costs
            # little more than a tuple comparison
            gather = itemgetter(*routes) if len(routes) > 1 else lambda rates, r=routes: tuple(rates[i] for i in r)
            self._remember(self.states, state, (routes, gather, gather(self.route_rate)), len(routes))
        else:
            routes, gather, rates = known
            changed = list(compress(range(len(routes)), map(ne, gather(self.route_rate), rates)))
            if changed:
                self._set_rates([routes[i] for i in changed], [rates[i] for i in changed], now)
        self.touched = []
        for f in self.started:
            if f.version == 0:  # its route's rate did not change: it starts at that rate
                f.rate = self.route_rate[f.route]
                self._schedule(f)
        self.started = []

    def _remember(self, memo: dict, key: bytes, value, routes: int) -> None:
        # About 64 bytes a route (list and tuple slots, a float, an int) plus the key; past the budget both memos
        # start over.
        self.memo_bytes += len(key) + 64 * routes
        if self.memo_bytes > _MEMO_BYTES:
            self.states.clear()
            self.rates.clear()
            self.memo_bytes = len(key) + 64 * routes
        memo[key] = value

    def _set_rates(self, routes, rates, now: float) -> None:
        route_rate = self.route_rate
        for r, x in zip(routes, rates):
            if route_rate[r] != x:
                route_rate[r] = x
                for f in self.route_flows[r].values():
                    f.remaining = f.left_at(now)
                    f.since = now
                    f.rate = x
                    self._schedule(f)

    def _schedule(self, f: Flow) -> None:
        f.version += 1
        t = f.since + f.remaining / f.rate if f.rate > 0 else (f.since if f.remaining <= 0 else float("inf"))
        heapq.heappush(self.finishes, (t, f.id, f.version, f))

    def _component(self, routes) -> list[int]:
        # Routes in flight that share a link, transitively, with the given ones (in flight or just emptied).
        seen_links: set[int] = set()
        stack = []
        for r in dict.fromkeys(routes):
            for l in self.route_links[r]:
                if l not in seen_links:
                    seen_links.add(l)
                    stack.append(l)
        seen: dict[int, None] = {}
        while stack:
            for r in self.link_routes[stack.pop()]:
                if r not in seen:
                    seen[r] = None
                    for l in self.route_links[r]:
                        if l not in seen_links:
                            seen_links.add(l)
                            stack.append(l)
        return list(seen)
