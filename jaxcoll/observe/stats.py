"""`jaxcoll.stats()`: per call site, how many times it ran, on how many bytes, with which plan and how long, since
the process started or since `stats(reset=True)`.

The runtime times one rank of every call, from its arrival to its call's end (what that rank's step waits for),
so the numbers include waiting for the slowest peer: a site whose median sits far above its minimum is one whose
ranks arrive apart, or whose calls meet a busy machine. The CPU runtime records every call; on GPUs, where a call
is a kernel the host does not wait for, no call is timed.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np

from jaxcoll.observe import sites


@dataclasses.dataclass(frozen=True)
class SiteStats:
    """One call site's calls (seconds)."""

    callsite: int
    collective: str
    plan: str
    nranks: int
    calls: int
    bytes: int  # the timed rank's input bytes in a call
    min_s: float
    median_s: float  # over the last 1024 calls at most
    max_s: float


class Stats(tuple):
    """Every call site that ran, in the order they were lowered; prints as a table (rich renders it too)."""

    def __rich__(self):
        from rich.table import Table
        table = Table(title="jaxcoll calls")
        for name, justify in (("site", "right"), ("collective", "left"), ("plan", "left"), ("ranks", "right"),
                              ("calls", "right"), ("bytes a rank", "right"), ("min", "right"),
                              ("median", "right"), ("max", "right")):
            table.add_column(name, justify=justify)
        for s in self:
            table.add_row(str(s.callsite), s.collective, s.plan, str(s.nranks), str(s.calls), _bytes(s.bytes),
                          _seconds(s.min_s), _seconds(s.median_s), _seconds(s.max_s))
        return table

    def __str__(self) -> str:
        from rich.console import Console
        console = Console(width=120, file=io.StringIO())
        console.print(self)
        return console.file.getvalue().rstrip()


def stats(reset: bool = False) -> Stats:
    """The calls of every jaxcoll call site since the process started or the last `stats(reset=True)` (which
    forgets them after reading). A site lowered but never run does not appear."""
    if not isinstance(reset, bool):
        raise TypeError(f"stats: reset must be True or False, got {reset!r}")
    from jaxcoll import runtime
    rows = []
    for r in runtime.call_stats(reset):
        site = sites.lookup(r["callsite"])
        rows.append(SiteStats(r["callsite"], site.collective if site else "?", site.plan if site else "?",
                              site.nranks if site else 0, int(r["calls"]), int(r["bytes"]), float(r["min_s"]),
                              float(np.median(r["recent_s"])) if r["recent_s"] else 0.0, float(r["max_s"])))
    return Stats(rows)


def _seconds(s: float) -> str:
    return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"
