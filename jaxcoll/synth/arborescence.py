"""Minimum-cost spanning arborescence (Chu-Liu/Edmonds): the pricing step of the tree packing."""

from __future__ import annotations

import numpy as np


def min_arborescence(cost: np.ndarray, root: int) -> list[int]:
    """Parent pointers (-1 at `root`) of a minimum-cost spanning out-tree rooted at `root`.
    `cost[u, v]` is the cost of edge u -> v (np.inf where there is none). Raises ValueError if some node cannot
    be reached from the root.

    Each level takes the cheapest incoming edge of every node and contracts all the cycles they close at once
    (not one cycle per level: on 256 ranks that took ~140 levels of n^2 work per tree, now a handful)."""
    n = cost.shape[0]
    c = np.array(cost, dtype=float)
    np.fill_diagonal(c, np.inf)
    c[:, root] = np.inf
    par = np.argmin(c, axis=0)
    inw = c[par, np.arange(n)]
    others = np.arange(n) != root
    if np.isinf(inw[others]).any():
        v = int(np.flatnonzero(np.isinf(inw) & others)[0])
        raise ValueError(f"node {v} has no incoming edge")
    comp, single, ncomp = _contract(par, root)
    if ncomp == n:
        out = par.tolist()
        out[root] = -1
        return out
    # Entering a cycle at v replaces v's cycle edge: the edge costs what it adds over inw[v]. Nodes outside the
    # cycles are components of their own (their entering edge is their parent edge). Edges inside a component
    # are left in `adj`: they land on the diagonal of `small`, which the recursion ignores, and never join a
    # component to its parent.
    adj = c - np.where(comp >= single, inw, 0.0)[None, :]
    order = np.argsort(comp, kind="stable")
    starts = np.searchsorted(comp[order], np.arange(single, ncomp)) - single  # each cycle's first in `order`
    grouped = adj[np.ix_(order, order)]  # the nodes on no cycle, then the cycles' nodes, cycle by cycle
    small = np.empty((ncomp, ncomp))
    small[:single, :single] = grouped[:single, :single]
    small[:single, single:] = np.minimum.reduceat(grouped[:single, single:], starts, axis=1)
    rows = np.minimum.reduceat(grouped[single:], starts, axis=0)
    small[single:, :single] = rows[:, :single]
    small[single:, single:] = np.minimum.reduceat(rows[:, single:], starts, axis=1)
    parent_comp = np.asarray(min_arborescence(small, int(comp[root])))
    # The edge that realizes each chosen component edge a -> b: the cheapest from a node of a into a node of b.
    from_parent = np.where(comp[:, None] == parent_comp[comp][None, :], adj, np.inf)
    best_u = np.argmin(from_parent, axis=0)
    best = from_parent[best_u, np.arange(n)]
    by_cost = np.lexsort((best, comp))  # per component, its cheapest entry first
    first = by_cost[np.searchsorted(comp[by_cost], np.arange(ncomp))]
    entering = first[parent_comp >= 0]
    out = par.copy()
    out[entering] = best_u[entering]
    out = out.tolist()
    out[root] = -1
    return out


def _contract(par: np.ndarray, root: int) -> tuple[np.ndarray, int, int]:
    """Component of each node when every cycle of the parent pointers becomes one node, the count of nodes on no
    cycle (root included; they keep ids 0.. in node order, the cycles come after them) and of components."""
    n = len(par)
    state = [0] * n  # 0 unseen, walk id otherwise
    state[root] = -1
    cycles = []
    for start in range(n):
        if state[start]:
            continue
        walk = []
        v = start
        while state[v] == 0:
            state[v] = start + 1
            walk.append(v)
            v = int(par[v])
        if state[v] == start + 1:
            cycles.append(walk[walk.index(v):])
    comp = np.full(n, -1, dtype=np.int64)
    for i, cycle in enumerate(cycles):
        comp[cycle] = i
    single = comp < 0
    nsingle = int(single.sum())
    comp[~single] += nsingle
    comp[single] = np.arange(nsingle)
    return comp, nsingle, nsingle + len(cycles)
