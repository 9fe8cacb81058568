"""The plans "auto" chooses among for a call: the built-ins, the plans synthesized for the group's layout, and
the plans a user registers.

A candidate has a name: a built-in's own ("two_shot"), "synth.<name>" for a synthesizer's plan ("synth.rhd",
`jaxcoll.synth.candidates`), or the name it was registered under. The synthesizers see the group as
`jaxcoll.topology.layout` draws it (one box per process, one switch per host), so a group spanning processes gets
plans that cross them as the hierarchy says. Synthesized plans are built once per (collective, layout) and kept.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from jaxcoll.plan import Collective, Plan, validate

# The collectives auto chooses among plans for; the others have one built-in plan per call (all_to_all: direct or
# hierarchical, chosen by layout; broadcast and ppermute: direct).
TUNED = (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER)
# Synthesized plans left out of the candidates auto prices without a tuning file: the tree packing at its
# throughput chunk factor (1024-8192 chunks a block, 33k-176k steps on 8 ranks) takes 0.4-0.7 s to build and pays
# a step per chunk, which on the CPU runtime costs more than it saves at every size measured (docs/tuning.md).
# `jaxcoll tune` still measures them.
LARGE = ("forest", "forest-shared")
# Beyond this many ranks the tree packing behind every forest plan takes seconds to tens of seconds (64 ranks: 22 s),
# too long to pay at trace time: auto prices the packed plans only up to it; `jaxcoll tune` measures them at any size.
PACKED_RANKS = 32

_lock = threading.Lock()
_registered: dict[tuple[Collective, int], dict[str, Plan]] = {}
_topologies: dict[tuple, object] = {}


def register(plan: Plan, name: str | None = None) -> str:
    """Make `plan` a candidate of "auto" for its collective and group size, under `name` (default: the plan's
    own name). The checker proves it first. Returns the name. ValueError names what is rejected: a plan of a
    collective auto does not choose for, a name taken by a built-in or a synthesized candidate, or a plan the
    checker refutes."""
    from jaxcoll import algorithms

    if not isinstance(plan, Plan):
        raise TypeError(f"register: plan must be a jaxcoll.plan.Plan, got {type(plan).__name__} {plan!r}"[:300])
    if plan.collective not in TUNED:
        raise ValueError(f"register: plan is a {plan.collective.value} plan; auto chooses among plans for "
                         f"{', '.join(c.value for c in TUNED)}")
    name = plan.name if name is None else name
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"register: name must be a non-empty string, got name={name!r}")
    if name in algorithms.BUILTINS[plan.collective] or name == "auto" or name.startswith("synth."):
        raise ValueError(f"register: name={name!r} is a built-in or synthesized candidate's; choose another")
    try:
        algorithms._proved(validate(plan))
    except Exception as e:  # PlanError from the checker or the structural validation
        raise ValueError(f"register: plan {name!r} does not compute {plan.collective.value} over "
                         f"{plan.nranks} ranks: {e}") from e
    with _lock:
        _registered.setdefault((plan.collective, plan.nranks), {})[name] = plan
    from jaxcoll.tune import choice
    choice.forget()
    return name


def unregister(name: str) -> None:
    """Remove every registered plan called `name` (KeyError if there is none)."""
    with _lock:
        found = [key for key, plans in _registered.items() if name in plans]
        if not found:
            raise KeyError(f"unregister: no plan is registered as {name!r}")
        for key in found:
            del _registered[key][name]
    from jaxcoll.tune import choice
    choice.forget()


def registered(collective, nranks: int) -> dict[str, Plan]:
    with _lock:
        return dict(_registered.get((Collective(collective), nranks), {}))


def topology(processes: Sequence[int], hosts: Sequence[int] | None = None):
    """The layout topology of a group (kept, so that its synthesized plans are built once)."""
    from jaxcoll.topology import layout

    key = (tuple(processes), tuple(hosts) if hosts is not None else None)
    with _lock:
        if key not in _topologies:
            _topologies[key] = layout(processes, hosts)
        return _topologies[key]


def candidates(collective, nranks: int, processes: Sequence[int] | None = None,
               hosts: Sequence[int] | None = None, *, large: bool = False) -> dict[str, Plan]:
    """Every candidate plan for `collective` over `nranks` ranks laid out as `processes` (rank r's process) and
    `hosts` (process p's host), by name: built-ins, synthesized (with the LARGE ones only if `large`), and
    registered."""
    from jaxcoll import algorithms, synth
    from jaxcoll.algorithms import hierarchical

    collective = Collective(collective)
    processes = tuple(processes) if processes else (0,) * nranks
    spans = len(set(processes)) > 1
    out: dict[str, Plan] = {}
    for name in algorithms.BUILTINS[collective]:
        if name == "hierarchical" and not spans:
            continue  # one process: the hierarchy is the direct plan
        if name == "hierarchical" and collective is not Collective.ALL_GATHER and not hierarchical.uniform(processes):
            continue  # its reductions need as many ranks in every process
        out[name] = algorithms.builtin(collective, name, nranks, processes=processes if spans else ())
    if collective in TUNED and nranks > 1:
        from jaxcoll.synth.select import plan_named
        from jaxcoll.topology import TopologyError

        topo = topology(processes, hosts)
        for name in synth.candidates(topo, collective):
            if not large and (name in LARGE or name.startswith("forest") and nranks > PACKED_RANKS):
                continue
            try:
                out[f"synth.{name}"] = plan_named(topo, collective, name)[0]
            except (TopologyError, ValueError):
                continue  # a plan this layout cannot have (a hierarchy over unequal boxes)
        out.update(registered(collective, nranks))
    return out


__all__ = ["LARGE", "TUNED", "candidates", "register", "registered", "topology", "unregister"]
