"""The box shift: the symmetry of k identical boxes on a rail-optimized fabric, which lets the tree packing solve
for the roots of one box only.

The shift maps rank j of box b to rank j of box b+1 (mod k), each switch to the switch that plays its part one
box over (NIC i of box b to NIC i of box b+1; a rail or the spine to itself), and so each link to a link. When it
maps every link to one of equal bandwidth and latency and every route (`Topology.route`) onto the route between
the images, the shifted copy of any packing is a packing of the same time, and so is the average of the k copies:
an optimal packing exists whose trees for box b's roots are box 0's trees shifted by b (`pack_trees`).

The switch map is found from the graph, not from names: a switch's image must sit at the same hop distances
from the shifted ranks as the switch does from the ranks, which singles out one switch on every preset. Whatever
the candidate map, `box_shift` returns it only after checking links and routes, so a topology that is not
symmetric (a link of one box slower, a route that breaks a tie differently) gets None and the full LP.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from jaxcoll.topology import Topology


@dataclasses.dataclass(frozen=True)
class BoxShift:
    """One shift of a topology by a box; `order` shifts give the identity."""

    order: int  # boxes
    nodes: np.ndarray  # node v -> its image (ranks first, then switches, as in Topology)
    links: np.ndarray  # link i -> the index of its image
    roots: tuple[int, ...]  # box 0's ranks: one of every orbit of ranks

    @property
    def ranks(self) -> np.ndarray:
        """Rank r -> its image."""
        return self.nodes[:len(self.roots) * self.order]

    def pairs(self, pairs: list[tuple[int, int, int]]) -> np.ndarray | None:
        """Index in `pairs` of each (rank, rank, channel)'s image, or None if some image is not in the list."""
        index = {p: i for i, p in enumerate(pairs)}
        ranks = self.ranks.tolist()
        image = [index.get((ranks[u], ranks[v], c)) for u, v, c in pairs]
        return None if None in image else np.array(image, dtype=np.int64)


def power(image: np.ndarray, b: int) -> np.ndarray:
    """The permutation `image` applied b times."""
    out = np.arange(len(image))
    for _ in range(b):
        out = image[out]
    return out


def orbits(image: np.ndarray, order: int) -> np.ndarray:
    """Orbit id of each element under the cyclic group of the permutation `image` (whose order divides `order`),
    numbered in the order of the orbits' smallest elements."""
    least = np.arange(len(image))
    moved = least
    for _ in range(order - 1):
        moved = image[moved]
        least = np.minimum(least, moved)
    return np.unique(least, return_inverse=True)[1]


def box_shift(topology: Topology) -> BoxShift | None:
    """The box shift of `topology` if it is a symmetry of its links and routes, else None (one box, boxes of
    different sizes, or any link or route that the shift does not map onto an equal one)."""
    k = len(topology.boxes)
    if k < 2 or len({len(b) for b in topology.boxes}) != 1:
        return None
    n = topology.nranks
    ranks = np.empty(n, dtype=np.int64)
    for b, box in enumerate(topology.boxes):
        ranks[list(box)] = topology.boxes[(b + 1) % k]
    nodes = _extend_to_switches(topology, ranks)
    if nodes is None or not (power(nodes, k) == np.arange(len(nodes))).all():
        return None
    links = np.empty(len(topology.links), dtype=np.int64)
    for i, l in enumerate(topology.links):
        a, b = int(nodes[l.src]), int(nodes[l.dst])
        j = topology.link_index.get((a, b))
        if j is None or topology.capacity(a, b) != topology.capacity(l.src, l.dst) \
                or topology.links[j].latency_us != l.latency_us:
            return None
        links[i] = j
    # Routes break ties by node order (Dijkstra's heap), which a shift need not preserve: check every route.
    image, rank_image = links.tolist(), ranks.tolist()
    for u in range(n):
        for v in range(n):
            if u == v or not topology.direct(u, v):
                continue
            gu, gv = rank_image[u], rank_image[v]
            if not topology.direct(gu, gv) or tuple(image[e] for e in topology.route(u, v)) != topology.route(gu, gv):
                return None
    return BoxShift(k, nodes, links, tuple(topology.boxes[0]))


def _extend_to_switches(topology: Topology, ranks: np.ndarray) -> np.ndarray | None:
    # A switch s maps to the switch whose hop distances from (and to) the shifted ranks are those of s from (and
    # to) the ranks. Switches alike in this (none on the presets) are paired in node order; the link check of
    # box_shift rejects a wrong pairing.
    n, nodes = topology.nranks, topology.num_nodes
    src = [l.src for l in topology.links]
    dst = [l.dst for l in topology.links]
    graph = csr_matrix((np.ones(len(src)), (src, dst)), shape=(nodes, nodes))
    hops = np.vstack([shortest_path(graph, unweighted=True, indices=range(n)),
                      shortest_path(graph.T.tocsr(), unweighted=True, indices=range(n))])
    hops[np.isinf(hops)] = -1
    # Row r of `hops` is about rank r; the row of ranks[r] must read the same at the image of each switch.
    shifted = np.empty_like(hops)
    shifted[np.r_[ranks, n + ranks]] = hops
    alike: dict[bytes, list[int]] = {}
    for s in range(n, nodes):
        alike.setdefault(hops[:, s].astype(np.int32).tobytes(), []).append(s)
    out = np.empty(nodes, dtype=np.int64)
    out[:n] = ranks
    taken: dict[bytes, int] = {}
    for s in range(n, nodes):
        key = shifted[:, s].astype(np.int32).tobytes()
        group = alike.get(key, [])
        i = taken.get(key, 0)
        if i >= len(group):
            return None
        out[s] = group[i]
        taken[key] = i + 1
    return out
