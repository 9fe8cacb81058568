"""Built-in algorithms: plans for every collective of the public API, and the trace-time choice among them.

`select` is what the lowering calls: it turns the `algorithm=` argument of a public collective ("auto", a
built-in name, or a user's Plan) into the plan embedded in the custom call.
"""

from __future__ import annotations

import functools

import numpy as np

from jaxcoll.algorithms import direct, hierarchical, ring, two_shot, tuning
from jaxcoll.plan import Collective, Plan, PlanError, validate
from jaxcoll.plan.collectives import definition

# collective -> algorithm name -> builder(nranks, **params)
BUILTINS = {
    Collective.ALL_REDUCE: {"direct": direct.all_reduce, "two_shot": two_shot.all_reduce, "ring": ring.all_reduce,
                            "hierarchical": hierarchical.all_reduce},
    Collective.ALL_GATHER: {"direct": direct.all_gather, "ring": ring.all_gather,
                            "hierarchical": hierarchical.all_gather},
    Collective.REDUCE_SCATTER: {"direct": direct.reduce_scatter, "ring": ring.reduce_scatter,
                                "hierarchical": hierarchical.reduce_scatter},
    Collective.ALL_TO_ALL: {"direct": direct.all_to_all, "hierarchical": hierarchical.all_to_all},
    Collective.BROADCAST: {"direct": direct.broadcast},
    Collective.PPERMUTE: {"direct": direct.ppermute},
}


def known(collective) -> list[str]:
    """The algorithm names accepted for a collective, "auto" first."""
    return ["auto", *BUILTINS[Collective(collective)]]


@functools.lru_cache(maxsize=512)
def builtin(collective: Collective, name: str, nranks: int, root: int = 0,
            perm: tuple[tuple[int, int], ...] = (), processes: tuple[int, ...] = ()) -> Plan:
    """The built-in plan `name` for `collective` over `nranks` ranks (cached: plans are immutable).
    `processes[r]` is the process of rank r, for the hierarchical plans (default: one process)."""
    build = BUILTINS[collective][name]
    if name == "hierarchical":
        return validate(build(processes or (0,) * nranks))
    params = {"root": root, "perm": perm}  # a builder takes the parameters of its collective's entry, in order
    return validate(build(nranks, *(params[p] for p in definition(collective).params)))


def select(collective, nranks: int, nbytes: int, dtype=None, algorithm="auto", *, root: int = 0,
           perm=(), processes=None) -> Plan:
    """The plan a call runs. `nbytes` is the rank's input size; `algorithm` is "auto", a built-in name or a
    Plan; `processes[r]`, when given, is the process hosting rank r (a group spanning processes). Raises
    ValueError for an unknown name and for a Plan that does not fit the call."""
    collective = Collective(collective)
    perm = tuple((int(a), int(b)) for a, b in perm)
    if isinstance(algorithm, Plan):
        return _check_user_plan(algorithm, collective, nranks, root, perm)
    if not isinstance(algorithm, str) or (algorithm != "auto" and algorithm not in BUILTINS[collective]):
        raise ValueError(f"algorithm={algorithm!r} is not known for {collective.value}; "
                         f"known: {', '.join(map(repr, known(collective)))}, or a jaxcoll.plan.Plan")
    processes = tuple(int(p) for p in processes) if processes is not None else ()
    if processes and len(processes) != nranks:
        raise ValueError(f"processes={processes} names {len(processes)} ranks, the group has {nranks}")
    name = tuning.auto(collective, nranks, nbytes, processes) if algorithm == "auto" else algorithm
    return builtin(collective, name, nranks, root, perm, processes)


def _check_user_plan(plan: Plan, collective: Collective, nranks: int, root: int, perm) -> Plan:
    if plan.collective is not collective:
        raise ValueError(f"algorithm= is a {plan.collective.value} plan ({plan.name or 'unnamed'}), "
                         f"but this call is a {collective.value}")
    if plan.nranks != nranks:
        raise ValueError(f"algorithm= is a plan for nranks={plan.nranks}, but the group has {nranks} ranks")
    params = definition(collective).params
    if "root" in params and plan.root != root:
        raise ValueError(f"algorithm= is a {collective.value} plan from root={plan.root}, but the call has "
                         f"root={root}")
    if "perm" in params and sorted(plan.perm) != sorted(perm):
        raise ValueError(f"algorithm= is a {collective.value} plan for perm={list(plan.perm)}, but the call has "
                         f"perm={list(perm)}")
    try:
        _proved(plan)
    except PlanError as e:
        raise ValueError(f"algorithm= plan {plan.name or repr(plan)} does not compute {collective.value}: {e}") from e
    return plan


@functools.lru_cache(maxsize=128)
def _proved(plan: Plan) -> Plan:
    """A user's plan runs only once the checker has proved it (data lands where the collective says, no
    deadlock, no race); proofs are cached since a plan is immutable."""
    from jaxcoll.lang import check

    check(validate(plan))
    return plan


__all__ = ["BUILTINS", "builtin", "known", "select"]
