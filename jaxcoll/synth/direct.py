"""Direct plans: every rank exchanges with every other rank in one hop (star trees), the latency-optimal shape.

For a small message the alpha term dominates: a ring pays N-1 hop latencies per phase, recursive halving and
doubling log2 N, a star one. all_gather: each root puts its block straight into every other rank's output;
reduce_scatter: every rank puts its partial of block r to rank r, which reduces them all at once; all_reduce:
both (the one-shot reduce_scatter then all_gather of NCCL's "two-shot" all-reduce, here with N chunks). Every
pair of ranks must be joined through switches only (`Topology.direct`); the selection skips the plan otherwise.
"""

from __future__ import annotations

from jaxcoll.plan import Plan
from jaxcoll.synth.trees import tree_per_root
from jaxcoll.topology import Topology


def star(nranks: int, root: int) -> tuple[int, ...]:
    """The tree whose every rank is a child of `root` (as an out-tree or an in-tree alike)."""
    return tuple(-1 if v == root else root for v in range(nranks))


def direct(topology: Topology, collective) -> Plan:
    n = topology.nranks
    return tree_per_root(collective, n, lambda r: star(n, r), "direct")
