"""Throughput-optimal plans by spanning-tree packing, after ForestColl.

Every rank r roots a set of weighted spanning trees (out-trees for all_gather, in-trees for reduce_scatter) that
together carry its block; a tree edge u -> v is a transfer along `Topology.route(u, v)`, through switches, so
switches never need to copy or reduce (ForestColl reaches the same rank-only graph by splitting switch edges off).
The packing minimizes the time T in which every link e carries its load:
    minimize T  subject to  sum over trees A of w_A * (edges of A routed over e) <= bandwidth(e) * T   (each e)
                            sum over trees A rooted at r of w_A = 1                                   (each r)
a linear program over exponentially many trees that we solve by column generation with HiGHS: the dual prices of
the links make a tree's reduced cost its price minus its root's dual, and the cheapest tree of each root is a
minimum-cost arborescence (Chu-Liu/Edmonds). When no tree prices out, the packing is optimal for this routing; it
meets the max-flow bound (`jaxcoll.synth.bound`) whenever one route per rank pair carries the optimum, and we stop
as soon as it does. Where it does not (dgx1, dgx2x2: the bound counts a PCIe path beside the route of two GPUs,
docs/synthesis.md), the LP is solved again with tree edges that may also take a pair's second route (channel 1 of
`Topology.route`); a tree then records the channel of each edge (`trees.Tree`). The first LP starts from trees chosen by multiplicative weights (each root's cheapest tree
when busy links cost more), which puts it near the optimum: a few rounds instead of hundreds on several boxes.
On k identical boxes (`synth/symmetry.py`) the LP has box 0's roots only and one row per orbit of links and pairs
under the box shift; box b's trees are box 0's shifted by b (`pack_trees`).

A chunk must be whole: the block is cut into k chunks and every tree carries a whole number of them. We round the
LP weights (largest remainder per root), then move single chunks between trees of a root, among all the trees the
column generation produced, while that unloads the busiest link: deterministic, no time limit, so a topology gives
the same plan on every run and machine. The throughput plan rounds at 1024 chunks (within ~0.1% of the LP) and
moves each tree's contiguous range of chunks in a few pieces (`forest`, `_pieces`), so the plan keeps the move
count of `chunk_cap` pieces per block.
`Packing.time(k)` reports how close the rounding gets.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix, hstack, identity

from jaxcoll.plan import Collective, Plan
from jaxcoll.synth.arborescence import min_arborescence
from jaxcoll.synth.bound import min_cut_ratio
from jaxcoll.synth.symmetry import BoxShift, box_shift, orbits
from jaxcoll.synth.trees import TreeRoute, channels_of, tree_of, tree_plan
from jaxcoll.topology import Topology

MAX_ROUNDS = 400
IMPROVE_STEPS = 400
ROUNDING_CHUNKS = 1024  # the throughput plan rounds a block to this many chunks (then moves them in pieces)
TAPER = 3  # a tree's first and last pieces halve in size over this many pieces (the pipeline's fill and drain)
SMALL_MOVE_BUDGET = 1 << 15  # moves of a plan up to 16 ranks (N^2 x pieces), kept for generation under 1 s
MID_MOVE_BUDGET = 3 << 18  # moves of a plan from 17 to 64 ranks (at most 256 pieces: 256 at 32 ranks, 192 at 64)
MOVE_BUDGET = 1 << 17  # moves of a plan above 64 ranks (N^2 x pieces), kept for 256 ranks under 30 s
PLAN_BYTES = 1 << 30  # the message the throughput plan is list-scheduled for (the bound's targets are at 1 GiB)
MIN_PIECES = 16  # ... where a block has this many pieces: fewer could not give every tree of a root its own
SEED_ROUNDS = 8  # multiplicative-weights trees per root before the first LP
SEED_SHARPNESS = 8.0  # the busiest row costs e^8 times an idle one of equal capacity
ALTERNATIVE_LINKS = 2  # a pair's alternative route joins the LP if it crosses one switch (`_pairs`)
# The plans' packings leave the links of the second routes this much of their bandwidth idle in the LP: those links
# carry the second routes beside other traffic (the NICs' on dgx2x2), and a schedule cannot keep them busy to the
# last byte where in-trees' joins wait for their slowest child. At 1 GiB (% of the bound, all_gather /
# reduce_scatter, best plan): dgx2x2 99.52 / 98.10 -> 99.36 / 99.43, dgx1 99.40 / 99.18 -> 99.57 / 99.55; from
# 0.94 to 0.98 dgx2x2's reduce_scatter stays above 99% (docs/synthesis.md, "Headroom on the second routes").
SECOND_ROUTE_HEADROOM = 0.97
MAX_SHIFTED_LOADS = 1 << 24  # entries of Packing.loads kept for the rounding on symmetric topologies (128 MiB)


@dataclasses.dataclass
class Packing:
    """Weighted trees per root. `trees[r]` is a list of (tree, weight); weights of a root sum to 1. A tree is its
    parent pointers, with the channel of each edge if some edge takes a pair's alternative route (`trees.Tree`).
    `t_unit` is the LP's time per byte of a rank's block (seconds per byte); `loads` maps a tree to its per-link
    edge counts."""

    topology: Topology
    inward: bool
    trees: list[list[tuple[tuple[int, ...], float]]]
    t_unit: float
    rounds: int
    columns: list[tuple[int, tuple[int, ...]]] = dataclasses.field(default_factory=list)
    loads: np.ndarray | None = None  # capacities x columns: edges of each column over each link and pair
    pairs: list = dataclasses.field(default_factory=list)  # (rank, rank, channel) a tree edge may take
    capacities: np.ndarray | None = None  # GB/s of each link, then of each pair (its max-min fair share)
    _rounded: dict = dataclasses.field(default_factory=dict)

    def _load(self, parent) -> np.ndarray:
        """Edges of a tree over each link, then over each pair's fair-share capacity (see `capacities`)."""
        nlinks = len(self.topology.links)
        fair = len(self.capacities) > nlinks
        index = self._pair_index()
        used = np.zeros(len(self.pairs))
        load = np.zeros(len(self.capacities))
        channels = channels_of(parent)
        for v, p in enumerate(parent):
            if p >= 0:
                a, b = (v, p) if self.inward else (p, v)
                c = channels[v] if channels is not None else 0
                i = index.get((a, b, c))
                if i is None and not fair:
                    load[list(self.topology.route(a, b, c))] += 1  # a route has each link once
                else:
                    used[index[a, b, c]] += 1
        return load + self._pair_loads() @ used

    def _pair_loads(self):
        """Rows (links, then pairs if `capacities` has them) x pairs: what one edge between a pair loads."""
        if "pair_loads" not in self._rounded:
            nlinks = len(self.topology.links)
            rows, cols = [], []
            for i, (a, b, c) in enumerate(self.pairs):
                route = self.topology.route(a, b, c)
                rows += route
                cols += [i] * len(route)
                if len(self.capacities) > nlinks:
                    rows.append(nlinks + i)
                    cols.append(i)
            self._rounded["pair_loads"] = csr_matrix((np.ones(len(rows)), (rows, cols)),
                                                     shape=(len(self.capacities), len(self.pairs)))
        return self._rounded["pair_loads"]

    def _pair_index(self) -> dict:
        if "pairs" not in self._rounded:
            self._rounded["pairs"] = {p: i for i, p in enumerate(self.pairs)}
        return self._rounded["pairs"]

    def counts(self, k: int) -> list[list[tuple[tuple[int, ...], int]]]:
        """Chunks per tree, per root, when each block is cut into k chunks (largest remainder, then `_improve`)."""
        if k not in self._rounded:
            self._rounded[k] = self._round(k)
        return self._rounded[k][0]

    def time(self, k: int) -> float:
        """Seconds per byte of block once the weights are rounded to k chunks (compare with `t_unit`)."""
        if k not in self._rounded:
            self._rounded[k] = self._round(k)
        return self._rounded[k][1]

    def _round(self, k: int):
        n = self.topology.nranks
        cap = self.capacities
        counts = self._largest_remainder(k)
        index = {col: j for j, col in enumerate(self.columns)}
        x = np.zeros(len(self.columns), dtype=np.int64)
        for r, trees in enumerate(counts):
            for parent, cnt in trees:
                x[index[(r, parent)]] = cnt
        x = self._improve(x, cap)
        counts = [[] for _ in range(n)]
        for (r, parent), cnt in zip(self.columns, x):
            if cnt > 0:
                counts[r].append((parent, int(cnt)))
        return counts, self._busiest(counts, k)

    def _improve(self, x: np.ndarray, cap: np.ndarray) -> np.ndarray:
        """Local search on the rounded counts: move one chunk of a root from a tree that crosses the busiest link
        to another tree of the same root while that lowers (busiest load, sum of squared loads)."""
        loads = self.loads / cap[:, None]
        roots = np.array([r for r, _ in self.columns])
        load = loads @ x

        def score(l):
            return (round(float(l.max()), 12), float((l * l).sum()))

        best = score(load)
        for _ in range(IMPROVE_STEPS):
            e = int(np.argmax(load))
            moved = False
            for a in np.flatnonzero((x > 0) & (loads[e] > 0)):
                same = np.flatnonzero((roots == roots[a]) & (loads[e] < loads[e, a]))
                if not len(same):
                    continue
                trial = load[:, None] - loads[:, [a]] + loads[:, same]
                peaks = trial.max(axis=0)
                j = int(np.argmin(peaks + 1e-9 * (trial * trial).sum(axis=0)))
                cand = score(trial[:, j])
                if cand < best:
                    x[a] -= 1
                    x[same[j]] += 1
                    load, best, moved = trial[:, j].copy(), cand, True
                    break
            if not moved:
                break
        return x

    def _busiest(self, counts, k: int) -> float:
        cap = self.capacities
        load = np.zeros(len(cap))
        index = {col: j for j, col in enumerate(self.columns)}
        for r, trees in enumerate(counts):
            for parent, x in trees:
                load += self.loads[:, index[(r, parent)]] * x
        return float((load / (cap * k)).max()) * 1e-9

    def _largest_remainder(self, k: int):
        out = []
        for trees in self.trees:
            raw = [w * k for _, w in trees]
            base = [math.floor(x + 1e-9) for x in raw]
            order = sorted(range(len(trees)), key=lambda i: -(raw[i] - base[i]))
            for i in order[:max(k - sum(base), 0)]:
                base[i] += 1
            out.append([(trees[i][0], base[i]) for i in range(len(trees)) if base[i] > 0])
        return out


def _pairs(topology: Topology, alternatives: bool = False):
    """(rank, rank, channel) a tree edge may take, with their (pairs x links) incidence. On channel 0 (the route):
    every direct pair inside a box; across boxes, from each rank only to the ranks of each other box that it
    reaches in the fewest hops (its own rail): the longer routes (through the spine) share the same NIC links, so
    they add no bandwidth, only more flows splitting it. With `alternatives`, also channel 1 of the pairs inside
    a box whose route and alternative (`Topology.channels`) each cross at most one switch: a GPU pair's PCIe
    switch beside their NVLink or NVSwitch route, which the max-flow bound counts. Longer alternatives would
    take PCIe or CPU links that the routes of other pairs need, and more pairs make the LP and pricing slower."""
    n = topology.nranks
    box = [topology.box_of(v) for v in range(n)]
    pairs = []
    for u in range(n):
        near: dict[int, int] = {}
        direct = [v for v in range(n) if u != v and topology.direct(u, v)]
        for v in direct:
            if box[v] != box[u]:
                near[box[v]] = min(near.get(box[v], 1 << 30), len(topology.route(u, v)))
        pairs += [(u, v, 0) for v in direct if box[v] == box[u] or len(topology.route(u, v)) == near[box[v]]]
    # A pair inside a box whose route leaves the box (through the NICs) would only take bandwidth from the
    # links between boxes.
    network = {e for u, v, _ in pairs if box[u] != box[v] for e in topology.route(u, v)}
    pairs = [(u, v, 0) for u, v, _ in pairs if box[u] != box[v] or not network.intersection(topology.route(u, v))]
    if alternatives:
        pairs += [(u, v, 1) for u, v, _ in pairs if box[u] == box[v] and len(topology.route(u, v)) <= 2
                  and topology.channels(u, v) == 2 and len(topology.route(u, v, 1)) <= ALTERNATIVE_LINKS]
    rows, cols = [], []
    for i, (u, v, c) in enumerate(pairs):
        for e in topology.route(u, v, c):
            rows.append(i)
            cols.append(e)
    incidence = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(pairs), len(topology.links)))
    return pairs, incidence


def pack_trees(topology: Topology, inward: bool = False, fair: bool = True, channels: bool = True,
               headroom: float = 1.0) -> Packing:
    """Optimal weighted spanning trees for all_gather (out-trees) or, with inward=True, reduce_scatter.

    On k identical boxes (`synth.symmetry.box_shift`) the LP is solved for box 0's roots only, with one row per
    orbit of links and pairs under the box shift, and box b's trees are box 0's shifted by b: the same optimum
    (the average of an optimal packing's k shifts is optimal and symmetric) from an LP k times smaller, priced
    at 1/k of the roots per round.

    Tree edges take the route of their rank pair; where that packing falls short of the max-flow bound and
    `channels`, the LP is solved again with the pairs' alternative routes too (`_pairs`), which meets it on dgx1
    and dgx2x2. Topologies at the bound on routes alone keep their packing, and pay nothing for the check.
    `headroom` < 1 packs that second LP as if the links of the second routes had only that fraction of their
    bandwidth (`SECOND_ROUTE_HEADROOM`, for the plans): the packing is then that much above the bound in the LP,
    and runs closer to it (docs/synthesis.md, "Headroom on the second routes")."""
    x = min_cut_ratio(topology, reverse=inward)[0]
    lower = 1 / float(x) if x else 0.0  # the max-flow bound, in ns per byte (0 for a single rank)
    packing = _pack(topology, inward, fair, *_pairs(topology), lower)
    if channels and packing.t_unit * 1e9 > lower * (1 + 1e-9):
        pairs, incidence = _pairs(topology, alternatives=True)
        if len(pairs) > len(packing.pairs):
            scale = np.ones(len(topology.links))
            if headroom != 1:
                scale[[e for u, v, c in pairs if c for e in topology.route(u, v, c)]] = headroom
            wider = _pack(topology, inward, fair, pairs, incidence, lower, scale)
            if wider.t_unit < packing.t_unit:
                packing = wider
    return packing


def _pack(topology: Topology, inward: bool, fair: bool, pairs, incidence, lower: float,
          scale: np.ndarray | None = None) -> Packing:
    """The column generation of `pack_trees` over tree edges on `pairs` ((rank, rank, channel), with their
    pairs x links `incidence`); `lower` is the bound in ns per byte, where it stops; `scale`, the fraction of each
    link's bandwidth the packing may plan for (the headroom)."""
    n = topology.nranks
    cap = np.array([l.bandwidth_GBps for l in topology.links])  # GB/s; T below is in ns per byte of block
    if scale is not None:
        cap = cap * scale
    if fair:
        from jaxcoll.sim.engine import max_min_rates
        rates = max_min_rates([np.asarray(topology.route(u, v, c)) for u, v, c in pairs], cap)
        incidence = hstack([incidence, identity(len(pairs), format="csr")]).tocsr()
        cap = np.concatenate([cap, rates])
    shift = box_shift(topology)
    row_image = _row_image(topology, shift, pairs, cap, fair) if shift is not None else None
    if row_image is None:
        roots = list(range(n))
        fold = identity(len(cap), format="csr")
        lp_cap = cap
    else:
        roots = list(shift.roots)
        fold, lp_cap = _fold(orbits(row_image, shift.order), shift.order, cap)
    slot = {r: i for i, r in enumerate(roots)}
    pair_array = np.array(pairs, dtype=np.int64).reshape(-1, 3)
    primary = pair_array[:, 2] == 0
    incidence_t = incidence.T.tocsr()
    lp_incidence_t = (fold @ incidence_t).tocsr()
    pair_index = {p: i for i, p in enumerate(pairs)}

    def cost_matrix(row_price: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Price of each pair (the sum over its links and its own row), as an edge cost matrix (an edge at the
        cheapest of its channels, the route on ties) and the channel of each edge."""
        edge_cost = np.asarray(incidence @ (fold.T @ row_price)).ravel()
        m = np.full((n, n), np.inf)
        channel = np.zeros((n, n), dtype=np.int64)
        u, v, c = pair_array[:, 0], pair_array[:, 1], pair_array[:, 2]
        if inward:
            u, v = v, u  # in-tree edge u -> v is out-tree edge v -> u of the transposed graph
        m[u[primary], v[primary]] = edge_cost[primary]
        for j in np.flatnonzero(~primary):
            if edge_cost[j] < m[u[j], v[j]]:
                m[u[j], v[j]] = edge_cost[j]
                channel[u[j], v[j]] = c[j]
        return edge_cost, m, channel

    def cheapest(costs: np.ndarray, channel: np.ndarray, root: int):
        parent = min_arborescence(costs, root)
        return tree_of(parent, [int(channel[p, v]) if p >= 0 else 0 for v, p in enumerate(parent)])

    def used_pairs(parent) -> np.ndarray:
        used = np.zeros(len(pairs))
        channels = channels_of(parent)
        for v, p in enumerate(parent):
            if p >= 0:
                a, b = (v, p) if inward else (p, v)
                used[pair_index[a, b, channels[v] if channels is not None else 0]] += 1
        return used

    columns: list[tuple[int, tuple[int, ...]]] = []
    uses: list[np.ndarray] = []  # per column: its edges on each pair (`used_pairs`)
    loads: list[np.ndarray] = []  # per column: its load on each row of the LP
    seen = set()

    def add(root: int, parent, use: np.ndarray) -> bool:
        key = (root, parent)
        if key in seen:
            return False
        seen.add(key)
        columns.append(key)
        uses.append(use)
        loads.append(lp_incidence_t @ use)
        return True

    # Seed trees by multiplicative weights: each root in turn takes its cheapest tree when a row costs more the
    # busier the trees so far make it (the first is the widest tree, cost 1/bandwidth). The first LP is then
    # feasible and near the optimum: from the widest trees alone, column generation needed 160 rounds on mi250x4
    # and did not finish 400 on dgx-h100x32 (the duals of a poor start price most rows at 0).
    seeded = np.zeros(len(lp_cap))
    for _ in range(SEED_ROUNDS):
        for r in roots:
            busy = seeded / lp_cap
            _, costs, channel = cost_matrix(np.exp(SEED_SHARPNESS * busy / max(busy.max(), 1e-300)) / lp_cap)
            parent = cheapest(costs, channel, r)
            use = used_pairs(parent)
            seeded += lp_incidence_t @ use
            add(r, parent, use)
    for r in roots:
        if all(((r, v, 0) if not inward else (v, r, 0)) in pair_index for v in range(n) if v != r):
            star = tuple(-1 if v == r else r for v in range(n))  # optimal on a single switch
            add(r, star, used_pairs(star))
    rounds = 0
    while True:
        rounds += 1
        m = len(columns)
        a_ub = np.zeros((len(lp_cap), m + 1))
        a_ub[:, 0] = -lp_cap
        a_ub[:, 1:] = np.stack(loads, axis=1)
        a_eq = np.zeros((len(roots), m + 1))
        for j, (r, _) in enumerate(columns):
            a_eq[slot[r], j + 1] = 1.0
        obj = np.zeros(m + 1)
        obj[0] = 1.0
        res = linprog(obj, A_ub=a_ub, b_ub=np.zeros(len(lp_cap)), A_eq=a_eq, b_eq=np.ones(len(roots)),
                      bounds=[(0, None)] * (m + 1), method="highs")
        if res.status != 0:
            raise RuntimeError(f"tree packing LP failed on {topology.name!r}: {res.message}")
        if rounds >= MAX_ROUNDS or res.x[0] <= lower * (1 + 1e-9):
            break  # at the bound no packing is faster: pricing could only confirm it
        y = -np.asarray(res.ineqlin.marginals)
        pi = np.asarray(res.eqlin.marginals)
        edge_cost, costs, channel = cost_matrix(y)
        added = 0
        for r in roots:
            parent = cheapest(costs, channel, r)
            use = used_pairs(parent)
            if edge_cost @ use < pi[slot[r]] - 1e-9 * max(1.0, abs(pi[slot[r]])) and add(r, parent, use):
                added += 1
        if not added:
            break
    weights = res.x[1:]
    if row_image is not None:
        # Every tree the LP saw stays a candidate of the rounding, unless the shifted copies' loads would not fit
        # in memory (dgx-h100x32: 12k trees x 11k rows); then the trees of the optimum.
        if shift.order * len(columns) * len(cap) > MAX_SHIFTED_LOADS:
            keep = np.flatnonzero(weights > 1e-9)
            columns, weights, uses = [columns[j] for j in keep], weights[keep], [uses[j] for j in keep]
        columns, weights, full_loads = _shifted(shift, row_image, columns, weights,
                                                [incidence_t @ use for use in uses])
    else:
        full_loads = np.stack([incidence_t @ use for use in uses], axis=1)
    trees: list[list] = [[] for _ in range(n)]
    for (r, parent), weight in zip(columns, weights):
        if weight > 1e-9:
            trees[r].append((parent, float(weight)))
    for r in range(n):
        total = sum(x for _, x in trees[r])
        trees[r] = [(p, x / total) for p, x in trees[r]]
    return Packing(topology, inward, trees, float(res.x[0]) * 1e-9, rounds, columns, full_loads, pairs, cap)


def _row_image(topology: Topology, shift: BoxShift, pairs, cap: np.ndarray, fair: bool) -> np.ndarray | None:
    """The image under the shift of each LP row (links, then pairs if `fair`), or None if the pairs a tree may use,
    their alternative routes or their fair-share capacities are not invariant (then the full LP is solved)."""
    pair_image = shift.pairs(pairs)
    if pair_image is None:
        return None
    links = shift.links.tolist()
    for (u, v, c), j in zip(pairs, pair_image.tolist()):
        if c > 0 and tuple(links[e] for e in topology.route(u, v, c)) != topology.route(*pairs[j]):
            return None
    image = np.concatenate([shift.links, len(shift.links) + pair_image]) if fair else shift.links
    if not np.allclose(cap[image], cap, rtol=1e-9, atol=0):
        return None
    return image


def _fold(orbit: np.ndarray, order: int, cap: np.ndarray):
    """The rows of the symmetric LP: (orbits x rows matrix that turns a tree's load on each row into its row of
    the symmetric LP, the capacity of each orbit). A tree A of box 0 stands for its `order` shifts, which load a
    row e as much as A loads all of e's orbit O, order / |O| times over (the shifts that fix e): sum over shifts g
    of load(gA, e) = sum over g of load(A, g^-1 e) = (order / |O|) sum over e' in O of load(A, e'). The members of
    an orbit have one capacity (checked by `_row_image`)."""
    size = np.bincount(orbit)
    fold = csr_matrix(((order / size)[orbit], (orbit, np.arange(len(orbit)))), shape=(len(size), len(orbit)))
    return fold, np.bincount(orbit, weights=cap) / size


def _shifted(shift: BoxShift, row_image: np.ndarray, columns, weights, loads):
    """Box 0's trees and their shifts by 1..k-1 boxes, with their weights and (links x trees) loads."""
    roots = np.array([r for r, _ in columns], dtype=np.int64)
    parents = np.array([parent for _, parent in columns], dtype=np.int64)
    channels = np.array([channels_of(parent) or (0,) * len(parent) for _, parent in columns], dtype=np.int64)
    loads = np.stack(loads, axis=1)
    m = len(columns)
    out_columns, out_loads = [], np.empty((loads.shape[0], shift.order * m))
    node, row = np.arange(len(shift.ranks)), np.arange(len(row_image))
    for b in range(shift.order):
        moved = np.empty_like(parents)
        moved[:, node] = np.where(parents >= 0, node[parents], -1)  # parent[v] = p becomes parent[gv] = gp
        moved_channels = np.empty_like(channels)
        moved_channels[:, node] = channels  # and so does the channel of v's edge (`_row_image` maps the routes)
        out_columns += [(int(r), tree_of(p, c))
                        for r, p, c in zip(node[roots].tolist(), moved.tolist(), moved_channels.tolist())]
        out_loads[row, b * m:(b + 1) * m] = loads
        node, row = shift.ranks[node], row_image[row]
    return out_columns, np.tile(weights, shift.order), out_loads


def chunk_cap(nranks: int) -> int:
    """Pieces per block for large messages. The pipeline's fill and drain cost about a tree's depth in piece
    times (the loss goes as 1/k: mi250 at 1 GiB runs at 98.0 / 99.0 / 99.5 / 99.7% of the bound with 64 / 128 /
    256 / 512 pieces), but a plan holds about N^2 k moves, and generating it costs about that:
    - up to 16 ranks, `SMALL_MOVE_BUDGET` moves: 128 pieces at 16 ranks (generation under 1 s), 512 at 8 (dgx1
      98.97 / 98.54% -> 99.40 / 99.18% of the bound with 128 -> 512, all_gather / reduce_scatter);
    - from 17 to 64 ranks, up to 256 pieces within `MID_MOVE_BUDGET` moves: 256 at 32 ranks, 192 at 64, tens of
      seconds (dgx-a100x4 reduce_scatter 98.8 -> 99.3% with 128 -> 256; dgx2x4 all_gather 94.7 / 98.0 / 99.2%
      with 32 / 64 / 128 pieces, reduce_scatter 94.1 / 98.9 / 99.3% with 32 / 128 / 192);
    - above, `MOVE_BUDGET` moves (2 pieces at 256 ranks, generation under 30 s)."""
    n = max(1, nranks)
    if n <= 16:
        k = SMALL_MOVE_BUDGET // (n * n)
    elif n <= 64:
        k = min(256, MID_MOVE_BUDGET // (n * n))
    else:
        k = MOVE_BUDGET // (n * n)
    return max(1, min(512, k))


def forest(topology: Topology, collective, chunk_factor: int | None = None,
           packings: tuple[Packing | None, Packing | None] | None = None, hop: float | None = None,
           shared: bool = False) -> Plan:
    """The spanning-tree-packing plan for all_gather, reduce_scatter or all_reduce (reduce_scatter trees, then
    all_gather trees). `chunk_factor`: pieces per block per root, each piece one chunk (default: `chunk_cap`
    pieces over `ROUNDING_CHUNKS` chunks, see `_pieces`). `shared`: list-schedule it last at the links' shared
    rates (`tree_plan`)."""
    collective = Collective(collective)
    n = topology.nranks
    out_p, in_p = packings if packings is not None else (None, None)
    need_out = collective in (Collective.ALL_GATHER, Collective.ALL_REDUCE)
    need_in = collective in (Collective.REDUCE_SCATTER, Collective.ALL_REDUCE)
    if not (need_out or need_in):
        raise ValueError(f"forest covers all_gather, reduce_scatter and all_reduce, got {collective.value!r}")
    if need_out and out_p is None:
        out_p = pack_trees(topology)
    if need_in and in_p is None:
        in_p = pack_trees(topology, inward=True)
    k = chunk_cap(n) if chunk_factor is None else chunk_factor
    chunks = max(k, ROUNDING_CHUNKS) if chunk_factor is None and k >= MIN_PIECES else k
    hop = 2.0 / k if hop is None else hop  # a hop costs about two pieces: best of those we measured
    pieces = []  # (position in the root's order of pieces, root, wave, first chunk, chunks, in-tree, out-tree)
    for r in range(n):
        ins = in_p.counts(chunks)[r] if need_in else None
        outs = out_p.counts(chunks)[r] if need_out else None
        for j, piece in enumerate(_pieces(ins if need_in else outs, outs if need_in and need_out else None,
                                          chunks, k, chunks > k)):
            pieces.append((j, r, *piece))
    pieces.sort(key=lambda x: (x[0], x[1]))
    routes = []
    for _, r, wave, first, count, t_in, t_out in pieces:
        if collective is Collective.ALL_GATHER:
            routes.append(TreeRoute(r, first, r * chunks + first, bcast_parent=t_in, wave=wave, hop=hop,
                                    count=count, bcast_channel=channels_of(t_in)))
        elif collective is Collective.REDUCE_SCATTER:
            routes.append(TreeRoute(r, r * chunks + first, first, reduce_parent=t_in, wave=wave, hop=hop,
                                    count=count, reduce_channel=channels_of(t_in)))
        else:
            c = r * chunks + first
            routes.append(TreeRoute(r, c, c, reduce_parent=t_in, bcast_parent=t_out, wave=wave, hop=hop,
                                    count=count, reduce_channel=channels_of(t_in),
                                    bcast_channel=channels_of(t_out)))
    kk = n * chunks if collective is Collective.ALL_REDUCE else chunks
    # The list schedule's chunks are those of a `PLAN_BYTES` message: a route's latency weighs against a piece's
    # time as it does at the size the plan is for (dgx-h100x4 all_gather 98.81 -> 99.35% of the bound at 1 GiB
    # with 32 MiB blocks instead of 128 MiB).
    return tree_plan(collective, n, kk, routes, name=f"forest{k}" + ("-shared" if shared else ""),
                     topology=topology, chunk_bytes=PLAN_BYTES / n / chunks, shared=shared)


def _taper(length: int, p: int, start: bool, end: bool) -> list[int]:
    """`length` chunks cut into `p` pieces, halving in size towards a tapered end over its last TAPER pieces."""
    m = min(TAPER, (p - 1) // (1 + (start and end)))
    w = [0.5 ** (max(0, m - i) * start + max(0, i - (p - 1 - m)) * end) for i in range(p)]
    raw = [length * x / sum(w) for x in w]
    size = [max(1, math.floor(x)) for x in raw]
    for i in sorted(range(p), key=lambda i: size[i] - raw[i])[:length - sum(size)]:
        size[i] += 1
    while sum(size) > length:  # the pieces raised to one chunk came from the largest
        size[size.index(max(size))] -= 1
    return size


def _pieces(first: list, second: list | None, chunks: int, k: int, taper: bool = False) -> list[tuple]:
    """One root's block of `chunks` chunks cut into about `k` pieces: (wave, first chunk, chunk count, tree,
    second tree) per piece, in the order of their waves. Each tree of `first` (a list of (tree, chunks)) takes a
    contiguous range of the block, and so does each of `second` (all_reduce's out-trees) independently; a piece
    lies inside one range of each, so a range boundary of either cuts a piece. A piece's wave is when a fluid
    schedule would send its middle along its first tree (the fraction of the tree's range before it).
    With `taper`, pieces halve in size towards both ends of each tree's range (`_taper`): the last pieces to leave
    cross their remaining hops sooner (the drain), and the first ones reach the links further down the tree
    sooner (the fill). Measured at 1 GiB, no taper / taper: dgx1x2 all_gather 98.23 / 99.37%, reduce_scatter
    98.04 / 99.11%, mi250x2 98.80 / 99.66% and 98.87 / 99.39% of the bound, with as many pieces."""
    def ranges(trees):
        out, at = [], 0
        for parent, c in trees:
            out.append((at, at + c, parent))
            at += c
        return out

    a = ranges(first)
    b = ranges(second) if second is not None else None
    cuts = sorted({x for lo, hi, _ in a for x in (lo, hi)} | ({x for lo, hi, _ in b for x in (lo, hi)} if b else set()))
    segments = list(zip(cuts, cuts[1:]))
    # pieces per segment: proportional to its length, at least one (largest remainder)
    raw = [(hi - lo) * k / chunks for lo, hi in segments]
    count = [max(1, min(hi - lo, math.floor(x))) for x, (lo, hi) in zip(raw, segments)]
    spare = k - sum(count)
    for i in sorted(range(len(segments)), key=lambda i: count[i] - raw[i]):
        if spare <= 0:
            break
        if count[i] < segments[i][1] - segments[i][0]:
            count[i] += 1
            spare -= 1
    out = []
    ia = ib = 0
    for (lo, hi), p in zip(segments, count):
        while a[ia][1] <= lo:
            ia += 1
        if b is not None:
            while b[ib][1] <= lo:
                ib += 1
        t_lo, t_hi, tree = a[ia]
        at = lo
        for c in _taper(hi - lo, p, taper and lo == t_lo, taper and hi == t_hi):
            out.append(((at + c / 2 - t_lo) / (t_hi - t_lo), at, c, tree, b[ib][2] if b is not None else None))
            at += c
    out.sort(key=lambda x: (x[0], x[1]))
    return out
