"""The tuning run behind `jaxcoll tune`: calibrate the job's model, measure the leading candidates of each cell,
and write the tuning file.

Each cell (collective, per-rank size) ranks every candidate by the model, then times side by side, alternating call
by call, the `top` it predicts fastest and any other it predicts within `margin` of its pick (up to `most`),
together with today's default (`jaxcoll.algorithms.tuning.auto`, what auto ran before any model). The candidates
whose medians come within `CLOSE` of the best are timed again, as many calls more. The cell's choice (`decide`) is
the model's pick if it is among them, else the best median, or among those within half of `CLOSE` of it the
steadiest (`steadiest`). Every process of a job runs the same cells in the same order (each timing is a collective
over the job's devices) and takes process 0's decisions; process 0 writes the file.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Sequence

from jaxcoll.plan import Collective
from jaxcoll.sim.machine import MachineModel


@dataclasses.dataclass
class Cell:
    collective: str
    nranks: int
    nbytes: int  # per-rank input bytes as measured (a multiple of the group size's elements)
    dtype: str
    choice: str
    default: str
    predicted: str  # the model's pick
    seconds: dict[str, list[float]]  # candidate -> samples
    predictions: dict[str, float]  # candidate -> the model's seconds

    def median(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def to_json(self, plans) -> dict:
        """The cell as the tuning file holds it: a registered plan whole (`plans[(collective, name)]`); a
        built-in or synthesized one by name (the same jaxcoll builds the same plan for the layout)."""
        from jaxcoll import algorithms
        by_name = self.choice in algorithms.BUILTINS[Collective(self.collective)] or self.choice.startswith("synth.")
        return {"collective": self.collective, "nranks": self.nranks, "bytes": self.nbytes, "dtype": self.dtype,
                "choice": self.choice, "plan": None if by_name else plans[self.collective, self.choice],
                "default": self.default,
                "seconds": {k: self.median(k) for k in self.seconds},
                "predicted": {k: self.predictions[k] for k in self.seconds}}


# Candidates the model predicts within this much of its pick are measured too: its error on this machine (median
# 15-20%, 90th percentile 40-75% under load; docs/tuning.md) is larger than most gaps between the leading plans.
MARGIN = 0.30


def default_name(collective: str, nranks: int, nbytes: int, processes: Sequence[int]) -> str:
    """What auto ran before the model: the hand-tuned table of `jaxcoll.algorithms.tuning`."""
    from jaxcoll.algorithms import tuning
    return tuning.auto(Collective(collective), nranks, nbytes, tuple(processes) if len(set(processes)) > 1 else ())


def tune_cells(collectives: Sequence[str], sizes: Sequence[int], *, model: MachineModel, mesh, processes, hosts,
               top: int = 3, margin: float = MARGIN, most: int = 8, reps: int = 5, warmup: int = 2,
               passes: int | None = None, dtype: str = "float32",
               progress: Callable[[str], None] | None = None) -> tuple[list[Cell], dict]:
    """Measure each cell's leading candidates; returns the cells and every measured plan by (collective, name).
    The cells are timed together, visited in turn `passes` times (`jaxcoll.tune.measure.time_cells`; None: its
    default); `progress` hears of each visit."""
    from jaxcoll.tune import choice, measure

    say = progress or (lambda _: None)
    n = mesh.devices.size
    spans, procs, hs = _group(processes, hosts)
    plans = {}
    shortlists = []  # (collective, size, ranked, default, {name: plan})
    for collective in collectives:
        for nbytes in sizes:
            size = measure.per_rank_elements(nbytes, n, dtype) * _itemsize(dtype)
            ranked = choice.rank_by_model(collective, n, size, procs, hs, large=True, the_model=model)
            default = default_name(collective, n, size, processes)
            # The model's top `top`, and every other candidate it cannot tell from its pick: within `margin` of its
            # predicted time (the model's error here is 15-35%), up to `most` in all.
            names = [name for i, (s, name, _) in enumerate(ranked)
                     if i < top or (i < most and s <= ranked[0][0] * (1 + margin))]
            if default not in names:
                names.append(default)
            by_name = {name: plan for _, name, plan in ranked}
            plans.update({(collective, name): by_name[name] for name in names})
            shortlists.append((collective, size, ranked, default, {name: by_name[name] for name in names}))

    which = [(c, size, shortlist) for c, size, _, _, shortlist in shortlists]
    times = measure.time_cells(which, mesh, reps=reps, warmup=warmup, passes=passes, dtype=dtype,
                               progress=lambda i: say(f"{which[i][0]} {which[i][1]} B"))
    # Candidates whose medians lie within CLOSE of the best are told apart by a second round of as many calls:
    # one round of a few calls on a busy machine crowns whichever plan had the lucky calls.
    close = [json.loads(_agreed(spans, lambda t=t: json.dumps(contenders(t)))) for t in times]
    again = [i for i, names in enumerate(close) if len(names) > 1]
    if again:
        more = measure.time_cells([(which[i][0], which[i][1], {name: which[i][2][name] for name in close[i]})
                                   for i in again], mesh, reps=reps, warmup=1, passes=passes, dtype=dtype)
        for i, extra in zip(again, more):
            for name, samples in extra.items():
                times[i][name] = times[i][name] + samples
    cells = []
    for (collective, size, ranked, default, _), t in zip(shortlists, times):
        # the job's choice is process 0's measurement
        fastest = _agreed(spans, lambda t=t, ranked=ranked: decide(t, ranked[0][1]))
        cells.append(Cell(collective, n, size, dtype, fastest, default, ranked[0][1], t,
                          {name: s for s, name, _ in ranked}))
    return cells, plans


def refined(model: MachineModel, measured, cells: list[Cell], plans: dict, processes, hosts) -> MachineModel:
    """The calibrated `model` fitted again to calibration's calls (`measured`, from `calibrate(measured=...)`)
    and every candidate the `cells` timed (`calibration.refit`): the model the tuning file keeps, which auto and
    `jaxcoll.tune.predict` price sizes, dtypes and plans the run did not measure with. Cells of 16-bit floats
    are left out: their scratch holds float32, twice their bytes, which calibration's rows do not count. Every
    process of a job calls it and goes on with process 0's fit."""
    from jaxcoll.sim.machine import widen
    from jaxcoll.tune import calibration

    spans, procs, hs = _group(processes, hosts)
    more = [(plans[c.collective, name], c.nbytes, c.median(name)) for c in cells if widen(c.dtype) == 1.0
            for name in c.seconds]
    return calibration.refit(model, [*measured, *more], (procs, hs), spans)


# Medians this close to the best are within this machine's noise (the calls of one plan in one cell spread by 30-60%
# of their median, max to min, on this VM under load; docs/tuning.md): such candidates are measured again, and the
# model's pick among them stays.
CLOSE = 0.10


def contenders(times: dict[str, list[float]], close: float = CLOSE) -> list[str]:
    """The candidates whose median is within `close` of the best median, best first."""
    medians = {k: statistics.median(v) for k, v in times.items()}
    best = min(medians.values())
    return sorted((k for k, m in medians.items() if m <= best * (1 + close)), key=lambda k: (medians[k], k))


def decide(times: dict[str, list[float]], pick: str, close: float = CLOSE) -> str:
    """The cell's choice from its measured `times`: the model's `pick` where it measured within `close` of the best
    median (the measurement cannot tell them apart, and the model's ranking holds from run to run where a noisy
    winner does not: two tuning files of 2026-11-27, scored against three runs of benchmarks/tuning.py on a busy
    machine, ran within 10% of the fastest in 99 of 141 cells so, in 93 with the best median), else the steadiest
    of the best."""
    if pick in times and pick in contenders(times, close):
        return pick
    return steadiest(times, close / 2)


def steadiest(times: dict[str, list[float]], close: float = CLOSE / 2) -> str:
    """The cell's choice: the best median, except that among the candidates within `close` of it the one whose
    slower calls are fastest (the upper quartile) wins. A plan as fast as another at its median but bimodal (some
    calls several times slower, issue 33) loses to a steady one: a program runs the plan many times, and its mean
    is what it pays."""
    def upper(k):
        v = sorted(times[k])
        return v[min(len(v) - 1, (3 * len(v)) // 4)]
    near = contenders(times, close)
    return min(near, key=lambda k: (upper(k), k))


def _group(processes, hosts) -> tuple[bool, tuple | None, tuple | None]:
    """Whether the group spans processes, and its layout as the model takes it: (processes, hosts), each None
    where the group has one (one process, one host)."""
    spans = len(set(processes)) > 1
    procs = tuple(processes) if spans else None
    hs = tuple(hosts) if spans and hosts is not None and len(set(hosts)) > 1 else None
    return spans, procs, hs


def _agreed(spans: bool, decide: Callable[[], str]) -> str:
    """`decide()` here, or process 0's across a job (every process must run the same programs next)."""
    if not spans:
        return decide()
    from jaxcoll import distributed
    from jaxcoll.tune.calibration import _next_run
    return distributed.agree(f"tune/cell/{_next_run()}", decide)


def _itemsize(dtype: str) -> int:
    import numpy as np
    return np.dtype(dtype).itemsize


def write(path: str, layout: str, processes, hosts, model: MachineModel, cells: list[Cell], plans: dict) -> None:
    """Merge this layout's model and cells into the tuning file at `path` (other layouts of a usable file are
    kept), atomically."""
    from jaxcoll.tune import file

    data = {"format": file.FORMAT, **file.versions(), "machine": file.machine(), "layouts": {}}
    try:
        old = file.read(path)
        data["layouts"] = {k: _plain(v) for k, v in old.layouts.items() if k != layout}
    except ValueError:
        pass  # none, or unusable: replaced whole
    data["layouts"][layout] = {"processes": list(processes), "hosts": None if hosts is None else list(hosts),
                               "model": model.to_json(), "cells": [c.to_json(plans) for c in cells]}
    file.write(path, data)


def _plain(entry: dict) -> dict:
    """A loaded layout entry as JSON again (its cells' plans are loaded Plans)."""
    from jaxcoll.plan import Plan
    out = dict(entry)
    out["cells"] = [{**c, "plan": c["plan"].to_json() if isinstance(c.get("plan"), Plan) else c.get("plan")}
                    for c in entry.get("cells", [])]
    return out
