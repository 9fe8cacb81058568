"""Choosing a plan: for (topology, collective, size), the candidate with the best simulated time.

Candidates: rings (1 and 2), NCCL's double binary tree at several pipeline depths (all_reduce), recursive halving
and doubling (power-of-two groups), the hierarchical plan (several boxes), the direct plan (star trees: one hop
latency), and the spanning-tree packing at its throughput chunk factor (from 17 to 32 ranks also list-scheduled
at the links' shared rates, "forest-shared") and at 1, 4 and 16 chunks per root.
The small chunk counts are the latency-aware choice: a packing pipelined over k chunks pays about k + depth
hop latencies and (k + depth - 1) / k of its bandwidth time, so the best k grows with the message; simulating
the few k on a geometric grid finds it (fewer chunks also round to fewer, so shallower, trees per root).
Ring and tree are always candidates (where the topology connects their hops directly), so the chosen plan is
never slower than either in simulation.
Plans, packings and choices are cached per topology object.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from jaxcoll.plan import Collective, Plan
from jaxcoll.sim import simulate
from jaxcoll.synth.direct import direct
from jaxcoll.synth.hierarchical import hierarchical
from jaxcoll.synth.packing import SECOND_ROUTE_HEADROOM, Packing, chunk_cap, forest, pack_trees
from jaxcoll.synth.rhd import rhd
from jaxcoll.synth.ring import ring
from jaxcoll.synth.tree import tree
from jaxcoll.topology import Topology, TopologyError

SUPPORTED = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_REDUCE)
# Group sizes whose all_gather and reduce_scatter also get the packing list-scheduled last at the links' shared
# rates ("forest-shared"): a pass that costs about one simulation of the plan. Up to 16 ranks the plain packing is
# within 0.5% of the bound and generation must stay under 1 s; at 64 ranks the plan holds 786k moves and the pass
# takes minutes (`chunk_cap`). all_reduce's plan has twice the moves (dgx-h100x4: 1.5M steps, the pass ~45 s for
# 98.5 -> 99.0% of the bound) and no target at the bound, only against ring and tree.
SHARED_RANKS = (17, 32)


@dataclasses.dataclass
class Candidate:
    name: str
    plan: Plan
    seconds: float  # simulated
    build_s: float  # generation time


class _Cache:
    def __init__(self):
        self.plans: dict = {}
        self.packings: dict = {}
        self.choice: dict = {}


def _cache(topology: Topology) -> _Cache:
    # Kept on the topology (`Topology.derived`), so that the plans, which are large, go when it does.
    return topology.derived.setdefault("synth.select", _Cache())


def packings(topology: Topology) -> tuple[Packing, Packing]:
    """The all_gather and reduce_scatter tree packings of a topology (cached)."""
    c = _cache(topology)
    if not c.packings:
        out = pack_trees(topology, headroom=SECOND_ROUTE_HEADROOM)
        symmetric = all(topology.capacity(b, a) == cap for (a, b), cap in topology.capacities().items())
        c.packings["in"] = pack_trees(topology, inward=True, headroom=SECOND_ROUTE_HEADROOM) if not symmetric else None
        c.packings["out"] = out
    return c.packings["out"], c.packings["in"] or _reverse(c.packings["out"])


def _reverse(p: Packing) -> Packing:
    # On a topology whose every link has an equal reverse, reduce_scatter's in-trees are the all_gather trees
    # with edges turned around; routes are recomputed by tree_plan, loads by Packing.
    import numpy as np
    rev = Packing(p.topology, True, p.trees, p.t_unit, p.rounds, p.columns, None, p.pairs, p.capacities)
    loads = np.stack([rev._load(parent) for _, parent in p.columns], axis=1)
    rev.loads = loads
    return rev


def candidates(topology: Topology, collective) -> dict[str, Callable[[], Plan]]:
    """Builders of the plans considered for `collective` on `topology`, by name."""
    collective = Collective(collective)
    if collective not in SUPPORTED:
        raise ValueError(f"synthesis covers {[c.value for c in SUPPORTED]}, got {collective.value!r}")
    n = topology.nranks
    out: dict[str, Callable[[], Plan]] = {
        "ring": lambda: ring(topology, collective, 1),
        "ring2": lambda: ring(topology, collective, 2),
    }
    if collective is Collective.ALL_REDUCE:
        for p in (1, 4, 16):
            out[f"tree{p}"] = lambda p=p: tree(topology, collective, p)
    if n & (n - 1) == 0 and n > 1:
        out["rhd"] = lambda: rhd(topology, collective)
    if len(topology.boxes) > 1 and len({len(b) for b in topology.boxes}) == 1:
        out["hierarchical"] = lambda: hierarchical(topology, collective)
    out["direct"] = lambda: direct(topology, collective)

    def packed(k=None, shared=False):
        return forest(topology, collective, k, packings(topology), shared=shared)

    out["forest"] = packed
    if SHARED_RANKS[0] <= n <= SHARED_RANKS[1] and collective is not Collective.ALL_REDUCE:
        out["forest-shared"] = lambda: packed(shared=True)
    for k in (1, 4, 16):
        if k < chunk_cap(n):
            out[f"forest{k}"] = lambda k=k: packed(k)
    return out


def plan_named(topology: Topology, collective, name: str) -> tuple[Plan, float]:
    """(plan, seconds to generate it) of one candidate, cached."""
    collective = Collective(collective)
    c = _cache(topology)
    key = (collective, name)
    if key not in c.plans:
        t0 = time.perf_counter()
        plan = candidates(topology, collective)[name]()
        c.plans[key] = (plan, time.perf_counter() - t0)
    return c.plans[key]


def evaluate(topology: Topology, collective, nbytes: float, names=None) -> list[Candidate]:
    """Every candidate (or those named) with its simulated time, fastest first."""
    collective = Collective(collective)
    out = []
    for name in (names or candidates(topology, collective)):
        try:
            plan, build = plan_named(topology, collective, name)
            seconds = simulate(plan, topology, nbytes)
        except TopologyError:
            continue  # the plan sends between ranks this topology does not connect directly
        out.append(Candidate(name, plan, seconds, build))
    return sorted(out, key=lambda c: c.seconds)


def synthesize(topology: Topology, collective, nbytes: float) -> Plan:
    """The plan with the best simulated time for `collective` on `topology` at size `nbytes` (nccl-tests' S)."""
    collective = Collective(collective)
    c = _cache(topology)
    key = (collective, float(nbytes))
    if key not in c.choice:
        c.choice[key] = evaluate(topology, collective, nbytes)[0].name
    return plan_named(topology, collective, c.choice[key])[0]
