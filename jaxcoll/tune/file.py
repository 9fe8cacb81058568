"""The tuning file: what `jaxcoll tune` measured on this machine, and what "auto" reads back.

JSON, one file per machine (by default `$XDG_CACHE_HOME/jaxcoll/tuning.json`, else `~/.cache/jaxcoll/tuning.json`;
`JAXCOLL_TUNING=path` points elsewhere, `JAXCOLL_TUNING=off` turns it off):

    {"format": "jaxcoll.tuning/1", "jaxcoll": "0.1.0", "jax": "0.10.2", "jaxlib": "0.10.2",
     "machine": {"cpu": "<model name>", "cores": 2, "memory_GiB": 24},
     "layouts": {"<layout>": {"processes": [...], "hosts": [...],
                              "model": {<jaxcoll.sim.machine.MachineModel>},
                              "cells": [{"collective": "all_reduce", "nranks": 8, "bytes": 1048576,
                                         "dtype": "float32", "choice": "synth.rhd", "plan": {<plan>}|null,
                                         "seconds": {"<candidate>": s, ...}, "default": "two_shot"}]}}}

A layout is a group's processes and hosts (`layout_key`); a cell's `bytes` is the per-rank input size it was
measured at, and auto uses the cell of the nearest size on a log scale. A chosen plan that is not a built-in is
stored whole, so the file runs the plan that was measured. The file is written atomically (a temporary file in
the same directory, then a rename): an interrupted run leaves the old one whole.

A file that cannot be used (not JSON, another format, another machine, another jaxcoll or jax, a plan the checker
refutes) is ignored with one warning naming the file and the reason; auto then uses the model.
"""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
import threading
import warnings
from collections.abc import Sequence

FORMAT = "jaxcoll.tuning/1"
ENV = "JAXCOLL_TUNING"


class TuningFileWarning(UserWarning):
    """A tuning file was ignored; the message names it and says why."""


def default_path() -> str:
    """Where the tuning file is read and written: JAXCOLL_TUNING, else the user's cache directory."""
    env = os.environ.get(ENV, "")
    if env and env.lower() != "off":
        return os.path.abspath(os.path.expanduser(env))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "jaxcoll", "tuning.json")


def disabled() -> bool:
    return os.environ.get(ENV, "").lower() == "off"


def machine() -> dict:
    """What makes timings of one machine comparable: the CPU model, the cores this process may use, the memory."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 0
    return {"cpu": cpu, "cores": cores, "memory_GiB": round(memory / (1 << 30))}


def versions() -> dict:
    import jax
    import jaxlib.version

    import jaxcoll
    return {"jaxcoll": jaxcoll.__version__, "jax": jax.__version__, "jaxlib": jaxlib.version.__version__}


def layout_key(processes: Sequence[int], hosts: Sequence[int] | None = None) -> str:
    """The name of a group layout: processes x ranks per process, and the hosts when there are several (the
    network transport between them; processes of one host share memory), e.g. "1x8", "2x4", "2x4/2hosts"."""
    procs = list(processes)
    counts = [procs.count(p) for p in sorted(set(procs), key=procs.index)]
    nhosts = len(set(hosts)) if hosts is not None else 1
    key = f"{len(counts)}x{'+'.join(map(str, counts)) if len(set(counts)) > 1 else counts[0]}"
    return key + (f"/{nhosts}hosts" if nhosts > 1 else "")


class TuningFile:
    """A tuning file's contents once checked: the calibrated models and the measured cells, by layout."""

    def __init__(self, path: str, data: dict):
        self.path = path
        self.data = data

    @property
    def layouts(self) -> dict:
        return self.data["layouts"]

    def cell(self, layout: str, collective: str, nranks: int, nbytes: int, dtype: str) -> dict | None:
        """The measured cell nearest `nbytes` (on a log scale, within a factor of 2) for the rest of the key."""
        entry = self.layouts.get(layout)
        if entry is None:
            return None
        best, gap = None, math.log(2) + 1e-9
        for c in entry.get("cells", []):
            if (c["collective"], c["nranks"], c["dtype"]) != (collective, nranks, dtype):
                continue
            d = abs(math.log(max(nbytes, 1)) - math.log(max(c["bytes"], 1)))
            if d <= gap:
                best, gap = c, d
        return best

    def model(self, layout: str):
        from jaxcoll.sim.machine import MachineModel
        entry = self.layouts.get(layout)
        return None if entry is None or "model" not in entry else MachineModel.from_json(entry["model"])


def read(path: str) -> TuningFile:
    """The tuning file at `path`, checked. ValueError says why it cannot be used."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"cannot be read: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"is not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"is not a jaxcoll tuning file of format {FORMAT!r} (format: {got!r})")
    here = machine()
    if data.get("machine") != here:
        raise ValueError(f"was made on another machine ({data.get('machine')}; this one: {here})")
    mine = versions()
    theirs = {k: data.get(k) for k in mine}
    if theirs != mine:
        raise ValueError("was made with " + ", ".join(f"{k} {theirs[k]}" for k in mine) + "; this is " +
                         ", ".join(f"{k} {mine[k]}" for k in mine))
    layouts = data.get("layouts")
    if not isinstance(layouts, dict):
        raise ValueError("has no 'layouts' object")
    for key, entry in layouts.items():
        _check_layout(key, entry)
    return TuningFile(path, data)


def _check_layout(key: str, entry) -> None:
    from jaxcoll import algorithms
    from jaxcoll.plan import Collective, Plan
    from jaxcoll.sim.machine import MachineModel

    if not isinstance(entry, dict):
        raise ValueError(f"layout {key!r} is not an object")
    if "model" in entry:
        try:
            MachineModel.from_json(entry["model"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"layout {key!r} has a malformed model: {e}") from None
    for i, c in enumerate(entry.get("cells", [])):
        where = f"layout {key!r} cell {i}"
        try:
            collective = Collective(c["collective"])
            nranks, nbytes = int(c["nranks"]), int(c["bytes"])
            choice = c["choice"]
            if nranks < 1 or nbytes < 1 or not isinstance(choice, str):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where} is malformed: {json.dumps(c)[:200]}") from None
        if c.get("plan") is None:
            if choice not in algorithms.BUILTINS[collective]:
                raise ValueError(f"{where} chooses {choice!r}, which is no built-in {collective.value} plan and "
                                 f"the file holds no plan for it")
            continue
        try:
            plan = Plan.from_json(c["plan"])
        except Exception as e:
            raise ValueError(f"{where}: its plan {choice!r} does not load: {e}") from None
        if plan.collective is not collective or plan.nranks != nranks:
            raise ValueError(f"{where}: its plan {choice!r} is a {plan.collective.value} plan for {plan.nranks} "
                             f"ranks, the cell a {collective.value} over {nranks}")
        try:
            algorithms._proved(plan)
        except Exception as e:
            raise ValueError(f"{where}: its plan {choice!r} fails the checker: {e}") from None
        c["plan"] = plan  # kept loaded


def write(path: str, data: dict) -> None:
    """Write `data` to `path` atomically (a temporary file beside it, flushed, then renamed over it)."""
    from jaxcoll.plan import Plan

    def encode(o):
        if isinstance(o, Plan):
            return o.to_json()
        raise TypeError(f"cannot write {type(o).__name__} to a tuning file")

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tuning-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=encode)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_lock = threading.Lock()
_loaded: dict[tuple, TuningFile | None] = {}


def current() -> TuningFile | None:
    """The tuning file auto uses now, or None (none there, turned off, or unusable: warned once per file state)."""
    if disabled():
        return None
    path = default_path()
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    with _lock:
        if key in _loaded:
            return _loaded[key]
    try:
        tf = read(path)
    except ValueError as e:
        warnings.warn(f"jaxcoll: ignoring the tuning file {path}: it {e}; auto uses the model", TuningFileWarning,
                      stacklevel=2)
        tf = None
    with _lock:
        _loaded[key] = tf
    return tf


__all__ = ["ENV", "FORMAT", "TuningFile", "TuningFileWarning", "current", "default_path", "layout_key", "machine",
           "read", "versions", "write"]
