"""Ring plans (NCCL's ring, several rings as NCCL's channels), on a ring order fitted to the topology.

The ring order is a Hamiltonian cycle of each box over its fastest direct connections (highest bottleneck
bandwidth first: the NVLink cube-mesh of a DGX-1, the xGMI mesh of an MI250), boxes joined in turn. Ring i of
`nrings` runs the order rotated by i and, for odd i, reversed, so rings use both directions of every link.
all_gather: every rank's chunk walks the ring once; reduce_scatter: each rank's chunk is reduced along the ring
towards its owner; all_reduce: both, with the buffer cut into N chunks per ring.
"""

from __future__ import annotations

import time

from jaxcoll.plan import Collective, Plan
from jaxcoll.synth.trees import TreeRoute, chain, in_chain, tree_plan
from jaxcoll.topology import Topology


def _hamiltonian_cycle(topology: Topology, ranks: list[int], budget_s: float = 0.2) -> list[int]:
    """A cycle through `ranks` maximizing its slowest hop (direct connections only); `ranks` in order if the
    search finds nothing within its budget."""
    n = len(ranks)
    if n <= 2:
        return list(ranks)
    bw = {(a, b): (topology.path_bandwidth_GBps(a, b) if topology.direct(a, b) else 0.0)
          for a in ranks for b in ranks if a != b}
    for threshold in sorted({v for v in bw.values() if v > 0}, reverse=True):
        deadline = time.monotonic() + budget_s / 4
        start = ranks[0]
        path, used = [start], {start}

        def extend() -> bool:
            if len(path) == n:
                return bw[path[-1], start] >= threshold
            if time.monotonic() > deadline:
                return False
            last = path[-1]
            for v in sorted(ranks, key=lambda v: (-bw.get((last, v), 0), v)):
                if v not in used and bw[last, v] >= threshold:
                    path.append(v)
                    used.add(v)
                    if extend():
                        return True
                    path.pop()
                    used.discard(v)
            return False

        if extend():
            return path
    return list(ranks)


def ring_order(topology: Topology) -> list[int]:
    """The ranks in ring order (see the module docstring). Each box's cycle is rotated (or reversed) so that the
    hop from one box to the next, and from the last box back to the first, is a direct connection."""
    cycles = [_hamiltonian_cycle(topology, list(box)) for box in topology.boxes]
    if len(cycles) == 1:
        return cycles[0]

    def variants(c):
        for rev in (False, True):
            base = c[::-1] if rev else c
            for i in range(len(base)):
                yield base[i:] + base[:i]

    for first in variants(cycles[0]):
        order, ok = list(first), True
        for b, c in enumerate(cycles[1:], start=1):
            last = b == len(cycles) - 1
            pick = next((v for v in variants(c) if topology.direct(order[-1], v[0])
                         and (not last or topology.direct(v[-1], first[0]))), None)
            if pick is None:
                ok = False
                break
            order += pick
        if ok:
            return order
    return [v for c in cycles for v in c]


def ring(topology: Topology, collective, nrings: int = 1, order: list[int] | None = None) -> Plan:
    """A plan of `nrings` rings for all_gather, reduce_scatter or all_reduce."""
    collective = Collective(collective)
    n = topology.nranks
    base = ring_order(topology) if order is None else list(order)
    orders = []
    for i in range(nrings):
        o = base[i:] + base[:i]
        orders.append(o[::-1] if i % 2 else o)
    routes = []
    for i, o in enumerate(orders):
        pos = {v: p for p, v in enumerate(o)}
        for r in range(n):
            p = pos[r]
            out = [o[(p + t) % n] for t in range(n)]  # from r around the ring
            inward = [o[(p + 1 + t) % n] for t in range(n)]  # ends at r
            if collective is Collective.ALL_GATHER:
                routes.append(TreeRoute(r, i, r * nrings + i, bcast_parent=chain(out, n)))
            elif collective is Collective.REDUCE_SCATTER:
                routes.append(TreeRoute(r, r * nrings + i, i, reduce_parent=in_chain(inward, n)))
            elif collective is Collective.ALL_REDUCE:
                c = i * n + r
                routes.append(TreeRoute(r, c, c, reduce_parent=in_chain(inward, n), bcast_parent=chain(out, n)))
            else:
                raise ValueError(f"ring covers all_gather, reduce_scatter and all_reduce, got {collective.value!r}")
    k = nrings * n if collective is Collective.ALL_REDUCE else nrings
    return tree_plan(collective, n, k, routes, name=f"ring{nrings}")
