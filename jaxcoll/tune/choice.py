"""What `algorithm="auto"` runs: the measured choice of the tuning file where it has the cell, else the candidate
the model predicts fastest.

Called at trace time by the lowering, once per call site and shape; the answer is kept per (collective, group
size, bytes, dtype, layout), so a later call site of the same cell costs a dictionary lookup. Building the
synthesized candidates of a layout is paid once per process (about 0.1 s for 8 ranks). In a group that spans
processes, process 0 chooses and the others take its choice through the job's key-value store: every process must
run the same plan, and models calibrated or files written apart could choose apart.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

import numpy as np

from jaxcoll.plan import Collective, Plan
from jaxcoll.sim import machine
from jaxcoll.tune import registry
from jaxcoll.tune import file

_lock = threading.Lock()
_chosen: dict[tuple, tuple[str, Plan]] = {}


def forget() -> None:
    """Drop the kept choices (after a registration, or a new tuning file)."""
    with _lock:
        _chosen.clear()


def model(processes: Sequence[int] | None = None, hosts: Sequence[int] | None = None) -> machine.MachineModel:
    """The CPU model for a group laid out as `processes` and `hosts`: the tuning file's calibration of this layout,
    else of a layout with as many processes and hosts, else the defaults with this machine's cores."""
    nranks = len(processes) if processes else 1
    processes = tuple(processes) if processes else (0,) * nranks
    tf = file.current()
    if tf is not None:
        exact = tf.model(file.layout_key(processes, hosts))
        if exact is not None:
            return exact
        kind = _kind(processes, hosts)
        for key, entry in tf.layouts.items():
            if "model" in entry and _kind(entry.get("processes", ()), entry.get("hosts")) == kind:
                return tf.model(key)
    from jaxcoll.runtime import _jaxcoll
    return machine.cpu_runtime(threads=threads_per_process(processes, hosts), solo_bytes=int(_jaxcoll.solo_bytes()))


def threads_per_process(processes: tuple[int, ...], hosts: tuple[int, ...]) -> int:
    """Threads a process's call uses with helpers: one per core, the cores shared by the processes of its host
    (processes told apart as hosts by JAXCOLL_TRANSPORT=tcp still share this machine's cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, len(set(processes))))


def _kind(processes, hosts) -> tuple[int, int]:
    return len(set(processes)), (len(set(hosts)) if hosts is not None else 1)


def rank_by_model(collective, nranks: int, nbytes: int, processes=None, hosts=None, *, large: bool = False,
                  the_model: machine.MachineModel | None = None, dtype="float32") -> list[tuple[float, str, Plan]]:
    """(predicted seconds, name, plan) of every candidate for `nbytes` per rank of `dtype`, fastest first."""
    m = the_model or model(processes, hosts)
    out = []
    for name, plan in registry.candidates(collective, nranks, processes, hosts, large=large).items():
        out.append((machine.seconds(plan, nbytes, m, work_of(plan, processes, hosts), dtype=dtype), name, plan))
    return sorted(out, key=lambda t: (t[0], t[1]))


# Works by (id(plan), layout); `_plans` holds each plan so that its id is never another's.
_works: dict[tuple, machine.Work] = {}
_plans: dict[int, Plan] = {}


def work_of(plan: Plan, processes=None, hosts=None) -> machine.Work:
    """`jaxcoll.sim.machine.work` of a plan in a layout, kept (plans are immutable; candidates are few)."""
    key = (id(plan), tuple(processes) if processes else None, tuple(hosts) if hosts is not None else None)
    w = _works.get(key)
    if w is None:
        w = machine.work(plan, processes, hosts)
        with _lock:
            _plans[id(plan)] = plan
            _works[key] = w
    return w


def choose(collective, nranks: int, nbytes: int, dtype, processes: Sequence[int] | None = None,
           hosts: Sequence[int] | None = None, *, agree: bool = False) -> tuple[str, Plan]:
    """(name, plan) that auto runs for `collective` over `nranks` ranks with `nbytes` per rank of `dtype`, ranks
    laid out as `processes` (rank r's process) and `hosts` (process p's host).

    `agree` (the lowering's): in a group that spans processes, take process 0's choice. The processes pair their
    choices in the order they make them (the n-th new cell of one with the n-th of the other: the same program
    lowers the same cells in the same order), and a process whose n-th cell is not process 0's (a program
    compiled for another dtype or shape, which the runtime then names) keeps its own choice rather than wait for
    one that never comes."""
    collective = Collective(collective)
    processes = tuple(int(p) for p in processes) if processes else None
    spans = processes is not None and len(set(processes)) > 1
    hosts = tuple(int(h) for h in hosts) if (spans and hosts is not None) else None
    key = (collective, nranks, int(nbytes), np.dtype(dtype).name, processes, hosts)
    agreeing = spans and agree
    with _lock:  # kept apart: a process's own look at a cell must not take a turn of the pairing
        if (key, agreeing) in _chosen:
            return _chosen[key, agreeing]

    def decide() -> str:
        return _decide(collective, nranks, int(nbytes), np.dtype(dtype).name, processes, hosts)

    if agreeing:
        from jaxcoll import distributed
        mine = _key_text(key)
        record = json.loads(distributed.agree(f"tune/auto/{_next_turn()}",
                                              lambda: json.dumps({"cell": mine, "choice": decide()})))
        name = record["choice"] if record["cell"] == mine else decide()
    else:
        name = decide()
    plan = _resolve(collective, nranks, int(nbytes), np.dtype(dtype).name, processes, hosts, name)
    with _lock:
        _chosen[key, agreeing] = (name, plan)
    return name, plan


_turns = 0


def _next_turn() -> int:
    """The number of this process's next agreed choice (each process counts its own, in the order it lowers)."""
    global _turns
    with _lock:
        _turns += 1
        return _turns


def _key_text(key) -> str:
    collective, nranks, nbytes, dtype, processes, hosts = key
    procs = ".".join(map(str, processes or ()))
    hs = ".".join(map(str, hosts or ()))
    return f"{collective.value}/{nranks}/{nbytes}/{dtype}/{procs}/{hs}"


def _decide(collective: Collective, nranks: int, nbytes: int, dtype: str, processes, hosts) -> str:
    tf = file.current()
    if tf is not None:
        cell = tf.cell(file.layout_key(processes or (0,) * nranks, hosts), collective.value, nranks, nbytes, dtype)
        if cell is not None:
            return cell["choice"]
    return rank_by_model(collective, nranks, nbytes, processes, hosts, dtype=dtype)[0][1]


def _resolve(collective, nranks, nbytes, dtype, processes, hosts, name: str) -> Plan:
    """The plan called `name`: the tuning file's, a built-in, a synthesized or a registered candidate."""
    tf = file.current()
    if tf is not None:
        cell = tf.cell(file.layout_key(processes or (0,) * nranks, hosts), collective.value, nranks, nbytes, dtype)
        if cell is not None and cell["choice"] == name and cell.get("plan") is not None:
            return cell["plan"]
    large = name.startswith("synth.forest")  # what auto leaves out unless it was chosen (registry.LARGE)
    found = registry.candidates(collective, nranks, processes, hosts, large=large)
    if name not in found:
        raise RuntimeError(f"jaxcoll: auto's choice {name!r} for {collective.value} over {nranks} ranks (made by "
                           f"process 0) is no candidate in this process: register the same plans in every process")
    return found[name]


__all__ = ["choose", "forget", "model", "rank_by_model", "work_of"]
