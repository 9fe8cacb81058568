"""Direct plans: every rank exchanges with every other rank in one hop (star trees), the latency-optimal shape.

For a small message the alpha term dominates: a ring pays N-1 hop latencies per phase, recursive halving and
doubling log2 N, a star one. all_gather: each root puts its block straight into every other rank's output;
reduce_scatter: every rank puts its partial of block r to rank r, which reduces them all at once; all_reduce:
both (the one-shot reduce_scatter then all_gather of NCCL's "two-shot" all-reduce, here with N chunks). Every
pair of ranks must be joined through switches only (`Topology.direct`); the selection skips the plan otherwise.
"""

from __future__ import annotations

from jaxcoll.plan import Collective, Plan
from jaxcoll.synth.trees import TreeRoute, tree_plan
from jaxcoll.topology import Topology


def star(nranks: int, root: int) -> tuple[int, ...]:
    """The tree whose every rank is a child of `root` (as an out-tree or an in-tree alike)."""
    return tuple(-1 if v == root else root for v in range(nranks))


def direct(topology: Topology, collective) -> Plan:
    collective = Collective(collective)
    n = topology.nranks
    routes = []
    for r in range(n):
        t = star(n, r)
        if collective is Collective.ALL_REDUCE:
            routes.append(TreeRoute(r, r, r, reduce_parent=t, bcast_parent=t))
        elif collective is Collective.ALL_GATHER:
            routes.append(TreeRoute(r, 0, r, bcast_parent=t))
        elif collective is Collective.REDUCE_SCATTER:
            routes.append(TreeRoute(r, r, 0, reduce_parent=t))
        else:
            raise ValueError(f"direct covers all_gather, reduce_scatter and all_reduce, got {collective.value!r}")
    k = n if collective is Collective.ALL_REDUCE else 1
    return tree_plan(collective, n, k, routes, name="direct")
