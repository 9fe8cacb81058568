"""Minimum-cost spanning arborescence (Chu-Liu/Edmonds): the pricing step of the tree packing."""

from __future__ import annotations

import numpy as np


def min_arborescence(cost: np.ndarray, root: int) -> list[int]:
    """Parent pointers (-1 at `root`) of a minimum-cost spanning out-tree rooted at `root`.
    `cost[u, v]` is the cost of edge u -> v (np.inf where there is none). Raises ValueError if some node cannot
    be reached from the root."""
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
    cycle = _find_cycle(par, root)
    if cycle is None:
        out = par.tolist()
        out[root] = -1
        return out
    in_cycle = np.zeros(n, dtype=bool)
    in_cycle[cycle] = True
    rest = np.flatnonzero(~in_cycle)
    m = len(rest)
    idx = np.full(n, m)
    idx[rest] = np.arange(m)
    c2 = np.full((m + 1, m + 1), np.inf)
    c2[:m, :m] = c[np.ix_(rest, rest)]
    cyc = np.asarray(cycle)
    entering = c[np.ix_(rest, cyc)] - inw[cyc][None, :]  # cost of replacing a cycle edge
    enter_at = cyc[np.argmin(entering, axis=1)]
    c2[:m, m] = entering.min(axis=1)
    leaving = c[np.ix_(cyc, rest)]
    leave_from = cyc[np.argmin(leaving, axis=0)]
    c2[m, :m] = leaving.min(axis=0)
    par2 = min_arborescence(c2, int(idx[root]))
    out = par.tolist()
    for i, v in enumerate(rest):
        p = par2[i]
        out[v] = -1 if p < 0 else (int(leave_from[i]) if p == m else int(rest[p]))
    u = int(rest[par2[m]])
    out[int(enter_at[par2[m]])] = u
    out[root] = -1
    return out


def _find_cycle(par: np.ndarray, root: int) -> list[int] | None:
    n = len(par)
    state = [0] * n  # 0 unseen, walk id otherwise
    state[root] = -1
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
            return walk[walk.index(v):]
    return None
