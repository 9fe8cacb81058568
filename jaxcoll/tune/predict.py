"""`predict`: the model's seconds for one call on this machine, for a built-in, a candidate's name or a Plan."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from jaxcoll.plan import Collective, Plan
from jaxcoll.sim import machine
from jaxcoll.tune import choice, registry


def predict(collective, *, nbytes: int, nranks: int, algorithm="auto", processes: Sequence[int] | None = None,
            hosts: Sequence[int] | None = None, dtype="float32", model: machine.MachineModel | None = None) -> float:
    """Predicted seconds of one call of `collective` with `nbytes` bytes of input per rank over `nranks` ranks,
    running `algorithm`: "auto" (what auto would run), a built-in name, a candidate's name ("synth.rhd", a
    registered plan's) or a Plan. `processes[r]` is the process of rank r and `hosts[p]` the host of process p
    for a group that spans processes (default: one process). `model` defaults to this machine's
    (`jaxcoll.tune.model`). ValueError names the argument and value it rejects."""
    try:
        collective = Collective(collective)
    except ValueError:
        raise ValueError(f"predict: collective={collective!r} is not a collective; known: "
                         f"{', '.join(c.value for c in Collective if c is not Collective.CUSTOM)}") from None
    for arg, value in (("nbytes", nbytes), ("nranks", nranks)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise ValueError(f"predict: {arg} must be a positive integer, got {arg}={value!r}")
    if processes is not None and len(processes) != nranks:
        raise ValueError(f"predict: processes={tuple(processes)} names {len(processes)} ranks, nranks={nranks}")
    if hosts is not None and (processes is None or len(hosts) <= max(processes)):
        raise ValueError(f"predict: hosts={tuple(hosts)} must name the host of every process in processes="
                         f"{None if processes is None else tuple(processes)}")
    procs = tuple(processes) if processes is not None and len(set(processes)) > 1 else None
    plan = _plan(collective, nranks, nbytes, dtype, procs, hosts if procs else None, algorithm)
    m = model or choice.model(procs, hosts if procs else None)
    return machine.seconds(plan, nbytes, m, choice.work_of(plan, procs, hosts if procs else None), dtype=dtype)


def _plan(collective: Collective, nranks: int, nbytes: int, dtype, processes, hosts, algorithm) -> Plan:
    from jaxcoll import algorithms

    if isinstance(algorithm, Plan):
        if algorithm.collective is not collective:
            raise ValueError(f"predict: algorithm= is a {algorithm.collective.value} plan, collective="
                             f"{collective.value!r}")
        if algorithm.nranks != nranks:
            raise ValueError(f"predict: algorithm= is a plan for {algorithm.nranks} ranks, nranks={nranks}")
        return algorithm
    if algorithm == "auto":
        if collective in registry.TUNED and nranks > 1:
            return choice.choose(collective, nranks, nbytes, dtype, processes, hosts)[1]
        return algorithms.select(collective, nranks, nbytes, dtype, "auto", processes=processes)
    if isinstance(algorithm, str):
        if algorithm in algorithms.BUILTINS[collective] and collective in registry.TUNED + (
                Collective.ALL_TO_ALL,):
            if algorithm == "hierarchical" and not processes:
                raise ValueError("predict: algorithm='hierarchical' needs processes= (a group spanning processes)")
            return algorithms.builtin(collective, algorithm, nranks, processes=processes or ())
        if collective in registry.TUNED:
            found = registry.candidates(collective, nranks, processes, hosts,
                                          large=algorithm.startswith("synth.forest"))
            if algorithm in found:
                return found[algorithm]
            known = ", ".join(map(repr, ["auto", *found]))
        else:
            known = ", ".join(map(repr, algorithms.known(collective)))
        raise ValueError(f"predict: algorithm={algorithm!r} is not known for {collective.value} over {nranks} "
                         f"ranks; known: {known}, or a Plan")
    raise ValueError(f"predict: algorithm must be a name or a jaxcoll.plan.Plan, got algorithm={algorithm!r}")
