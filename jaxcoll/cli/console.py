"""How the `jaxcoll` command talks to its user: help that shows defaults and examples, progress for work that
takes more than a second (rich, transient, drawn only on a terminal, so a command's output stays its tables), and
the warnings that a busy machine makes timings meaningless (a load average above the core count before a run;
other processes' share of the CPU time during it)."""

from __future__ import annotations

import argparse
import os
import threading
import time


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions and examples as written; every option with a default says it (one without, none)."""

    def _get_help_string(self, action):
        if action.default is None or action.required or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def with_progress(fn, label: str, *, after_s: float = 1.0):
    """fn()'s result; a spinner with `label` and the time elapsed shows on stderr (a terminal only) once it has
    taken `after_s` seconds. fn runs on a thread of its own; its exception is raised here."""
    done = threading.Event()
    result = {}

    def work():
        try:
            result["value"] = fn()
        except BaseException as e:  # re-raised below, in the caller's thread
            result["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    if not done.wait(after_s):
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        with Progress(SpinnerColumn(), TextColumn(label), TimeElapsedColumn(), transient=True,
                      console=Console(stderr=True)) as bar:
            bar.add_task(label, total=None)
            done.wait()
    if "error" in result:
        raise result["error"]
    return result["value"]


def cpu_clock() -> tuple[float, float, float] | None:
    """(wall seconds, CPU seconds the whole machine has spent busy, CPU seconds this process and the children it
    has waited for have used), for `busy_meanwhile`; None where /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait
    own = os.times()
    return (time.monotonic(), busy / os.sysconf("SC_CLK_TCK"),
            own.user + own.system + own.children_user + own.children_system)


def busy_meanwhile(start: tuple[float, float, float] | None) -> str | None:
    """A warning when other processes used more than a quarter of the cores' time since `cpu_clock()` gave
    `start` (this process's own threads, and its children once waited for, do not count), else None."""
    end = cpu_clock()
    if start is None or end is None or end[0] <= start[0]:
        return None
    cores = os.cpu_count() or 1
    others = (end[1] - start[1]) - (end[2] - start[2])
    share = others / ((end[0] - start[0]) * cores)
    if share <= 0.25:
        return None
    return (f"other processes used {100 * share:.0f}% of the {cores} cores' time during the run, so these timings "
            "mean little; rerun on a quiet machine")


def busy_machine() -> str | None:
    """A warning when the 1-minute load average is above the core count (other work competes for the cores, so
    timings mean little), else None."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return None
    cores = os.cpu_count() or 1
    if load <= cores:
        return None
    return (f"the load average is {load:.1f} on {cores} cores: other work is running, so these timings mean little; "
            "rerun on a quiet machine")

