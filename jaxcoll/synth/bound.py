"""The optimal all_gather / reduce_scatter time on a topology, computed exactly with max-flow.

ForestColl's bound: with S the bytes of the gathered buffer and N ranks,
    T* = (S/N) * max over node sets C that leave out at least one rank of |C ∩ ranks| / B+(C),
B+(C) the bandwidth of the links leaving C: the data of the ranks in C must cross those links to reach the rank
left out. Write x* = 1 / max(...) = min over C of B+(C) / |C ∩ ranks| (GB/s per block of data). Then x >= x* iff
the cut condition fails somewhere, which max-flow decides without enumerating subsets: add a source s with an
edge of capacity x to every rank; for every rank t, maxflow(s, t) >= N x iff every C not containing t has
B+(C) >= x |C ∩ ranks| (a cut of the flow network is (N - |C ∩ ranks|) x + B+(C)).

We find x* by Dinkelbach's (discrete Newton) iteration: start from the ratio of a single rank's out-bandwidth; while
some max-flow falls short, its minimum cut C has a strictly smaller ratio B+(C)/|C ∩ ranks|, which becomes the
next x. Each x is the ratio of an actual cut, so the loop ends at x* exactly. Capacities are fractions scaled to
integers for scipy's max-flow, so nothing is rounded.

reduce_scatter is all_gather on the reversed graph (data flows into the roots); all_reduce is bounded by
reduce_scatter followed by all_gather, ForestColl's all_reduce bound for schedules of that shape.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from jaxcoll.plan import Collective
from jaxcoll.topology import Topology

_INT32_MAX = 2**31 - 1


def _lcm_denominators(values) -> int:
    out = 1
    for v in values:
        out = math.lcm(out, Fraction(v).denominator)
    return out


def min_cut_ratio(topology: Topology, reverse: bool = False) -> tuple[Fraction, frozenset[int]]:
    """x* = min over node sets C leaving out a rank of B+(C) / |C ∩ ranks| (GB/s), exactly, and a set C that
    attains it. With reverse=True, B-(C) (bandwidth entering C): the reduce_scatter version. Cached on the
    topology (`Topology.derived`)."""
    key = f"synth.min_cut_ratio.{'in' if reverse else 'out'}"
    if key not in topology.derived:
        topology.derived[key] = _min_cut_ratio(topology, reverse)
    return topology.derived[key]


def _min_cut_ratio(topology: Topology, reverse: bool) -> tuple[Fraction, frozenset[int]]:
    n, nodes = topology.nranks, topology.num_nodes
    caps = {((b, a) if reverse else (a, b)): c for (a, b), c in topology.capacities().items()}
    if n == 1:
        return Fraction(0), frozenset()
    out_bw = [sum((c for (a, _), c in caps.items() if a == v), Fraction(0)) for v in range(n)]
    x = min(out_bw)
    best = frozenset({int(np.argmin([float(b) for b in out_bw]))})
    s = nodes
    src_list = [a for a, _ in caps] + [s] * n
    dst_list = [b for _, b in caps] + list(range(n))
    while True:
        scale = _lcm_denominators(list(caps.values()) + [x])
        values = [int(c * scale) for c in caps.values()] + [int(x * scale)] * n
        if max(values) * n > _INT32_MAX:
            raise OverflowError(f"capacities of {topology.name!r} are too fine for exact max-flow "
                                f"(scale {scale}); round bandwidths to fewer digits")
        graph = csr_matrix((np.asarray(values, dtype=np.int32), (src_list, dst_list)), shape=(s + 1, s + 1))
        need = int(x * scale) * n
        improved = False
        for t in range(n):
            result = maximum_flow(graph, s, t)
            if result.flow_value >= need:
                continue
            residual = graph - result.flow
            residual.data[residual.data < 0] = 0
            residual.eliminate_zeros()
            reach = set(breadth_first_order(residual, s, directed=True, return_predecessors=False).tolist())
            cut = frozenset(v for v in reach if v != s)
            leaving = sum((c for (a, b), c in caps.items() if a in cut and b not in cut), Fraction(0))
            ranks_in = sum(1 for v in cut if v < n)
            ratio = leaving / ranks_in
            if ratio < x:
                x, best, improved = ratio, cut, True
                break
        if not improved:
            return x, best


def lower_bound(topology: Topology, collective, nbytes: float) -> float:
    """Seconds below which no plan runs `collective` on `topology` for nccl-tests size `nbytes` (the gathered
    buffer for all_gather, the input for reduce_scatter, the buffer for all_reduce): see the module docstring."""
    collective = Collective(collective)
    n = topology.nranks
    if n == 1:
        return 0.0
    block = float(nbytes) / n
    ag = block / (float(min_cut_ratio(topology)[0]) * 1e9)
    rs = block / (float(min_cut_ratio(topology, reverse=True)[0]) * 1e9)
    if collective is Collective.ALL_GATHER:
        return ag
    if collective is Collective.REDUCE_SCATTER:
        return rs
    if collective is Collective.ALL_REDUCE:
        return ag + rs
    raise ValueError(f"lower_bound covers all_gather, reduce_scatter and all_reduce, got {collective.value!r}")
