"""What each lowered call site runs, by its callsite id (the custom call's `callsite` attribute, unique in the
process): the lowering records it, and the runtime's per-site numbers are named by it. No JAX here."""

from __future__ import annotations

import dataclasses
import threading


@dataclasses.dataclass(frozen=True)
class Site:
    callsite: int
    collective: str  # "all_reduce", ...
    plan: str  # the plan's name ("two_shot", "synth.rhd", a registered plan's)
    nranks: int


_lock = threading.Lock()
_sites: dict[int, Site] = {}


def record(site: Site) -> None:
    with _lock:
        _sites[site.callsite] = site


def lookup(callsite: int) -> Site | None:
    with _lock:
        return _sites.get(callsite)
