"""`jaxcoll.trace`: per-step event traces of the CPU runtime and the CUDA executor, written as Chrome/Perfetto
trace-event JSON.

While a trace is open, every call the CPU runtime starts, and every call the CUDA executor enqueues outside a CUDA
graph's capture, records each step of each lane of each rank it runs (in this process): when the step started
and ended (GPU steps: %globaltimer, moved onto the host's monotonic clock), what it moved (bytes, peer) and, for
a wait, which signal it consumed and whose plan sends it (csrc/trace.hpp). `with jaxcoll.trace(path):` traces the calls that run inside
the block; `JAXCOLL_TRACE=path` traces a whole run and writes the file when the process exits. In a job of
several processes each process writes its own file, `path` with `.p<process>` before its suffix
(`trace.json` -> `trace.p0.json`, `trace.p1.json`); `jaxcoll trace show` reads them together.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pathlib
import socket
import threading

import numpy as np

from jaxcoll.observe import trace_events

ENV = "JAXCOLL_TRACE"

_lock = threading.Lock()
_open = 0  # tracers open in this process (blocks and the whole-run one): events are forgotten when none is


def _native():
    from jaxcoll import runtime  # loads the native module, which holds the events
    if runtime._jaxcoll.trace_event_size() != trace_events.EVENT.itemsize:
        raise ImportError(f"jaxcoll's native module records {runtime._jaxcoll.trace_event_size()}-byte trace events, "
                          f"jaxcoll.observe.trace_events reads {trace_events.EVENT.itemsize}: rebuild the module")
    return runtime._jaxcoll


def _open_tracer() -> int:
    """Open a tracer; the events' clock now (monotonic ns), where this tracer's events begin."""
    global _open
    native = _native()
    with _lock:
        since = native.trace_clock_ns()[0]  # before the switch: every event it lets through starts after this
        _open += 1
        native.open_tracer()
        return since


def _close_tracer(since_ns: int) -> tuple[np.ndarray, int]:
    """Close a tracer opened at `since_ns`: the events that started since (every thread's), and how many were
    overwritten in full buffers. The last tracer to close forgets the events."""
    global _open
    native = _native()
    with _lock:
        _open -= 1
        native.close_tracer()
        data, dropped = native.trace_events(_open == 0)
    events = np.frombuffer(data, dtype=trace_events.EVENT)
    return events[events["start_ns"] >= since_ns], int(dropped)


class trace(contextlib.ContextDecorator):
    """Record every step of every jaxcoll call the CPU runtime or the CUDA executor runs in this process inside the
    block (GPU calls captured into a CUDA graph excepted), and write them to `path` as Chrome/Perfetto trace-event
    JSON when the block ends (also when it ends in an error, such as a call's timeout: the file then shows the
    steps up to the hang). Open it in https://ui.perfetto.dev or chrome://tracing, or draw it with
    `jaxcoll trace show path --out lanes.png`.

    JAX dispatches asynchronously: block on the results (`jax.block_until_ready`) inside the block, or the calls
    may run after it has closed. In a job of several processes each process writes `path` with `.p<process>`
    before its suffix. Docs: docs/observability.md."""

    def __init__(self, path: str | os.PathLike):
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise TypeError(f"trace: path must be a file path, got {path!r}")
        self.path = pathlib.Path(path)
        # Checked now, not when the block ends: a trace that cannot be written would be lost with every call
        # traced into it.
        folder = self.path.parent
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(f"trace: path={str(path)!r} cannot be written: its folder {str(folder)!r} "
                             f"{'is not writable' if folder.is_dir() else 'does not exist'}")
        self._since: list[int] = []

    def __enter__(self) -> "trace":
        self._since.append(_open_tracer())
        return self

    def __exit__(self, *exc) -> bool:
        events, dropped = _close_tracer(self._since.pop())
        trace_events.write(process_path(self.path), events, _about_this_process(dropped))
        return False


def process_path(path: pathlib.Path) -> pathlib.Path:
    """`path` for this process: itself in a one-process program, `<stem>.p<process><suffix>` in a job."""
    from jaxcoll import distributed
    world = distributed.world()
    if world is None or world.nprocesses == 1:
        return path
    return path.with_name(f"{path.stem}.p{world.process}{path.suffix or '.json'}")


def _about_this_process(dropped: int) -> dict:
    """The file's otherData: who wrote it, and the monotonic clock paired with the wall clock (for other hosts)."""
    from jaxcoll import distributed
    monotonic, realtime = _native().trace_clock_ns()
    other = {"clock": "CLOCK_MONOTONIC", "realtime_minus_monotonic_ns": realtime - monotonic,
             "host": socket.gethostname(), "pid": os.getpid(), "dropped_events": dropped}
    world = distributed.world()
    if world is not None:
        other.update(process=world.process, processes=world.nprocesses, host_index=world.hosts[world.process])
    return other


def _trace_whole_run() -> None:
    """JAXCOLL_TRACE=path: trace from now until the process exits, then write the file."""
    value = os.environ.get(ENV, "")
    if not value:
        return
    if value in ("0", "1"):
        raise ValueError(f"jaxcoll: {ENV}={value!r} is not a file path: {ENV} names the trace file to write "
                         f"(docs/observability.md); each rank's join is logged by JAXCOLL_LOG_JOINS=1")
    whole_run = trace(value)
    whole_run.__enter__()
    atexit.register(whole_run.__exit__, None, None, None)


_trace_whole_run()
