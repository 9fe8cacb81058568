"""A topology: the directed graph of ranks, switches and NICs that a plan runs on.

Nodes 0..N-1 are the ranks (the GPUs, or the CPU runtime's devices); the nodes after them are named switches
(NVSwitch, PCIe switch, NIC, rail switch). Each directed link has a bandwidth in GB/s (10^9 bytes/s) and a
latency in microseconds. Ranks compute and may relay data (a plan forwards chunks through them); switches only
route: a transfer from rank a to rank b follows a path whose inner nodes are all switches (`Topology.route`), the
lowest-latency one, or on channel 1 an alternative that shares no link with it (`Topology.channels`).

The file format (`Topology.load`, `Topology.from_dict`) is
    {"name": str, "ranks": N, "switches": [names],
     "links": [{"src": rank|name, "dst": rank|name, "bandwidth_GBps": float, "latency_us": float,
                "bidirectional": bool (default true)}],
     "boxes": [[ranks of box 0], ...] (optional), "memory_bandwidth_GBps": float (optional)}
Parallel links between the same pair add their bandwidth (and keep the larger latency). Bandwidths are kept as
exact fractions (`Topology.capacity`) so the bound and the tree packing can be computed without rounding.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from jaxcoll.topology.errors import TopologyError


@dataclasses.dataclass(frozen=True)
class Link:
    """A directed link between two nodes (node ids: ranks first, then switches)."""

    src: int
    dst: int
    bandwidth_GBps: float
    latency_us: float


def _fraction(value: Any, what: str) -> Fraction:
    try:
        if isinstance(value, bool):
            raise TypeError
        # Fraction(str(float)) keeps the decimal the user wrote (12.5 -> 25/2), not the binary expansion.
        return Fraction(str(value)) if isinstance(value, float) else Fraction(value)
    except (TypeError, ValueError, ZeroDivisionError):
        raise TopologyError(f"{what} must be a number, got {value!r}") from None


class Topology:
    """A directed graph of ranks and switches with bandwidth and latency on each link.

    Build one with `Topology(name, nranks, switches, links)` where links are `(src, dst, bandwidth_GBps,
    latency_us)` tuples over node names or ids (one direction each), with `Topology.from_dict` or `load`
    (the file format of the module docstring), or take a preset (`jaxcoll.topology.preset`).
    """

    def __init__(self, name: str, nranks: int, switches: Sequence[str] = (),
                 links: Iterable[tuple] = (), boxes: Sequence[Sequence[int]] | None = None,
                 memory_bandwidth_GBps: float | None = None):
        if not isinstance(nranks, int) or isinstance(nranks, bool) or nranks < 1:
            raise TopologyError(f"'ranks' must be a positive integer, got {nranks!r}")
        self.name = str(name)
        self.nranks = nranks
        self.switches = tuple(str(s) for s in switches)
        self._ids: dict[Any, int] = {r: r for r in range(nranks)}
        for i, s in enumerate(self.switches):
            if s in self._ids or s.isdigit():
                raise TopologyError(f"switch name {s!r} is repeated or looks like a rank number")
            self._ids[s] = nranks + i
        caps: dict[tuple[int, int], Fraction] = {}
        lats: dict[tuple[int, int], Fraction] = {}
        for i, link in enumerate(links):
            src, dst, bw, lat = link
            a, b = self.node_id(src, f"link {i} src"), self.node_id(dst, f"link {i} dst")
            if a == b:
                raise TopologyError(f"link {i} connects node {src!r} to itself")
            bw = _fraction(bw, f"link {i} bandwidth_GBps")
            lat = _fraction(lat, f"link {i} latency_us")
            if bw <= 0:
                raise TopologyError(f"link {i} ({src!r} -> {dst!r}): bandwidth_GBps must be positive, got "
                                    f"{float(bw)}")
            if lat < 0:
                raise TopologyError(f"link {i} ({src!r} -> {dst!r}): latency_us must be >= 0, got {float(lat)}")
            caps[a, b] = caps.get((a, b), Fraction(0)) + bw
            lats[a, b] = max(lats.get((a, b), Fraction(0)), lat)
        self._caps = caps
        self._lats = lats
        self.links: tuple[Link, ...] = tuple(Link(a, b, float(c), float(lats[a, b]))
                                             for (a, b), c in sorted(caps.items()))
        self.link_index = {(l.src, l.dst): i for i, l in enumerate(self.links)}
        self._out: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for i, l in enumerate(self.links):
            self._out[l.src].append(i)
        if boxes is None:
            boxes = [list(range(nranks))]
        self.boxes = tuple(tuple(int(r) for r in box) for box in boxes)
        if sorted(r for box in self.boxes for r in box) != list(range(nranks)):
            raise TopologyError(f"'boxes' must partition ranks 0..{nranks - 1}, got {boxes!r}")
        self.memory_bandwidth_GBps = None if memory_bandwidth_GBps is None else float(memory_bandwidth_GBps)
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._alternatives: dict[tuple[int, int], tuple[int, ...] | None] = {}
        # What other layers derive from this topology and keep (the synthesizer's packings, plans and choices,
        # jaxcoll.synth.select): it lives and dies with the topology.
        self.derived: dict[str, Any] = {}
        self._check_connected()

    # -- nodes -----------------------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return self.nranks + len(self.switches)

    def node_id(self, node: Any, what: str = "node") -> int:
        """The id of a rank (int) or switch (name)."""
        key = node
        if isinstance(node, str) and node.isdigit():
            key = int(node)
        if isinstance(key, bool) or key not in self._ids:
            raise TopologyError(f"{what}: unknown node {node!r} (ranks are 0..{self.nranks - 1}, switches are "
                                f"{list(self.switches)[:8]}{'...' if len(self.switches) > 8 else ''})")
        return self._ids[key]

    def node_name(self, node: int) -> str:
        return str(node) if node < self.nranks else self.switches[node - self.nranks]

    def is_rank(self, node: int) -> bool:
        return node < self.nranks

    def box_of(self, rank: int) -> int:
        for b, box in enumerate(self.boxes):
            if rank in box:
                return b
        raise TopologyError(f"rank {rank} is in no box")

    # -- links -----------------------------------------------------------------------------------------------
    def capacity(self, src: int, dst: int) -> Fraction:
        """Exact bandwidth (GB/s) of the link src -> dst, 0 if there is none."""
        return self._caps.get((src, dst), Fraction(0))

    def capacities(self) -> dict[tuple[int, int], Fraction]:
        return dict(self._caps)

    def out_links(self, node: int) -> list[Link]:
        return [self.links[i] for i in self._out[node]]

    def route(self, src: int, dst: int, channel: int = 0) -> tuple[int, ...]:
        """Link indices of the path a transfer from rank src to rank dst takes on `channel`. Channel 0 (and -1,
        none named) is the lowest-latency path whose inner nodes are switches (ranks do not route), ties going to
        the widest bottleneck; channel 1 is the alternative (`channels`). Raises TopologyError if the two ranks
        have no such path (then data must be relayed through a rank)."""
        if channel > 0:
            return self._alternative(src, dst, channel)
        key = (src, dst)
        if key not in self._routes:
            self._routes.update(self._shortest_from(src))
        path = self._routes.get(key)
        if path is None:
            raise TopologyError(f"{self.name}: rank {src} has no path to rank {dst} through switches")
        return path

    def channels(self, src: int, dst: int) -> int:
        """How many routes rank src has to rank dst (0 if none through switches): the route of channel 0 and,
        where one exists, an alternative through switches that shares no link with it (channel 1), the
        lowest-latency such path. The max-flow bound counts both (a PCIe path beside an NVLink), so a plan
        that spreads a pair's transfers over its channels can use what one route leaves idle."""
        if not self.direct(src, dst):
            return 0
        return 2 if self._alternative_path(src, dst) is not None else 1

    def _alternative(self, src: int, dst: int, channel: int) -> tuple[int, ...]:
        path = self._alternative_path(src, dst) if channel == 1 else None
        if path is None:
            raise TopologyError(f"{self.name}: ranks {src} -> {dst} have no route on channel {channel} (they have "
                                f"{self.channels(src, dst)})")
        return path

    def _alternative_path(self, src: int, dst: int) -> tuple[int, ...] | None:
        key = (src, dst)
        if key not in self._alternatives:
            primary = set(self.route(src, dst))
            self._alternatives[key] = self._shortest_from(src, avoid=primary).get(key)
        return self._alternatives[key]

    def direct(self, src: int, dst: int) -> bool:
        """Whether rank src reaches rank dst without relaying through another rank."""
        try:
            self.route(src, dst)
            return True
        except TopologyError:
            return False

    def path_latency_us(self, src: int, dst: int, channel: int = 0) -> float:
        return sum(self.links[i].latency_us for i in self.route(src, dst, channel))

    def path_bandwidth_GBps(self, src: int, dst: int) -> float:
        return min(self.links[i].bandwidth_GBps for i in self.route(src, dst))

    def _shortest_from(self, src: int, avoid=frozenset()) -> dict[tuple[int, int], tuple[int, ...] | None]:
        # Dijkstra on (latency, hops, -bottleneck) over the links not in `avoid`; inner nodes must be switches.
        # Every extension adds a hop, so a node's route is final when it is popped: one pass gives the same route
        # to each rank as a search that stops there. Ranks without a route map to None.
        best: dict[int, tuple] = {src: (0.0, 0, -float("inf"))}
        prev: dict[int, int] = {}
        heap = [(0.0, 0, -float("inf"), src)]
        while heap:
            lat, hops, negbw, u = heapq.heappop(heap)
            if best.get(u) != (lat, hops, negbw):
                continue
            if u != src and self.is_rank(u):
                continue
            for i in self._out[u]:
                if i in avoid:
                    continue
                l = self.links[i]
                cand = (lat + l.latency_us, hops + 1, max(negbw, -l.bandwidth_GBps))
                if l.dst not in best or cand < best[l.dst]:
                    best[l.dst] = cand
                    prev[l.dst] = i
                    heapq.heappush(heap, (*cand, l.dst))
        routes: dict[tuple[int, int], tuple[int, ...] | None] = {}
        for dst in range(self.nranks):
            if dst == src or dst not in prev:
                routes[src, dst] = None
                continue
            path = []
            v = dst
            while v != src:
                i = prev[v]
                path.append(i)
                v = self.links[i].src
            routes[src, dst] = tuple(reversed(path))
        return routes

    def _check_connected(self) -> None:
        # Every rank must reach every other, relaying through ranks if need be (a plan can forward chunks):
        # strong connectivity is rank 0 reaching everyone and everyone reaching rank 0.
        for forward in (True, False):
            adj: list[list[int]] = [[] for _ in range(self.num_nodes)]
            for l in self.links:
                (adj[l.src] if forward else adj[l.dst]).append(l.dst if forward else l.src)
            seen = {0}
            stack = [0]
            while stack:
                for v in adj[stack.pop()]:
                    if v not in seen:
                        seen.add(v)
                        stack.append(v)
            missing = [r for r in range(self.nranks) if r not in seen]
            if missing:
                a, b = (0, missing[0]) if forward else (missing[0], 0)
                raise TopologyError(f"topology {self.name!r}: rank {a} has no path to rank {b}")

    # -- files -----------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping) -> "Topology":
        """Build from the file format of the module docstring; TopologyError names the entry that is wrong."""
        if not isinstance(d, Mapping):
            raise TopologyError(f"a topology must be a JSON object, got {type(d).__name__}")
        for key in ("ranks", "links"):
            if key not in d:
                raise TopologyError(f"topology is missing the required key {key!r}")
        links = []
        if not isinstance(d["links"], list):
            raise TopologyError("'links' must be a list")
        for i, e in enumerate(d["links"]):
            if not isinstance(e, Mapping):
                raise TopologyError(f"link {i} must be an object, got {e!r}")
            for key in ("src", "dst", "bandwidth_GBps"):
                if key not in e:
                    raise TopologyError(f"link {i} is missing {key!r}: {dict(e)}")
            unknown = set(e) - {"src", "dst", "bandwidth_GBps", "latency_us", "bidirectional"}
            if unknown:
                raise TopologyError(f"link {i} has unknown keys {sorted(unknown)}")
            lat = e.get("latency_us", 0.0)
            links.append((e["src"], e["dst"], e["bandwidth_GBps"], lat))
            if e.get("bidirectional", True):
                links.append((e["dst"], e["src"], e["bandwidth_GBps"], lat))
        return cls(d.get("name", "topology"), d["ranks"], d.get("switches", ()), links, d.get("boxes"),
                   d.get("memory_bandwidth_GBps"))

    @classmethod
    def load(cls, path) -> "Topology":
        try:
            with open(path) as f:
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise TopologyError(f"{path}: not valid JSON: {e}") from e
        try:
            return cls.from_dict(d)
        except TopologyError as e:
            raise TopologyError(f"{path}: {e}") from None

    def to_dict(self) -> dict:
        def num(x: Fraction):
            return int(x) if x.denominator == 1 else float(x)
        return {
            "name": self.name,
            "ranks": self.nranks,
            "switches": list(self.switches),
            "links": [{"src": self._key(a), "dst": self._key(b), "bandwidth_GBps": num(c),
                       "latency_us": num(self._lats[a, b]), "bidirectional": False}
                      for (a, b), c in sorted(self._caps.items())],
            "boxes": [list(b) for b in self.boxes],
            **({"memory_bandwidth_GBps": self.memory_bandwidth_GBps}
               if self.memory_bandwidth_GBps is not None else {}),
        }

    def save(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    def _key(self, node: int):
        return node if self.is_rank(node) else self.node_name(node)

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}, ranks={self.nranks}, switches={len(self.switches)}, "
                f"links={len(self.links)}, boxes={len(self.boxes)})")

