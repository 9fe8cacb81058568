"""`jaxcoll.trace`: per-step event traces of the CPU runtime and the CUDA executor, written as Chrome/Perfetto
trace-event JSON.

While a trace is open, every call the CPU runtime starts, and every call the CUDA executor enqueues outside a CUDA
graph's capture, records each step of each lane of each rank it runs (in this process): when the step started
and ended (GPU steps: %globaltimer, moved onto the host's monotonic clock), what it moved (bytes, peer) and, for
a wait, which signal it consumed and whose plan sends it (csrc/trace.hpp). `with jaxcoll.trace(path):` traces the calls that run inside
the block; `JAXCOLL_TRACE=path` traces a whole run and writes the file when the process exits. In a job of
several processes each process writes its own file, `path` with `.p<process>` before its suffix
(`trace.json` -> `trace.p0.json`, `trace.p1.json`); `jaxcoll trace show` reads them together.

A process stopped by SIGTERM or SIGINT while a trace is open writes what it traced so far, then the signal takes
the course it would have taken (the default handlers: SIGTERM ends the process, SIGINT raises KeyboardInterrupt);
handlers the program set itself are left alone. SIGKILL cannot be caught: a process killed by it writes nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pathlib
import signal
import socket
import sys
import threading

import numpy as np

from jaxcoll.observe import trace_events

ENV = "JAXCOLL_TRACE"

_lock = threading.Lock()
_open = 0  # tracers open in this process (blocks and the whole-run one): events are forgotten when none is
_tracers: list[tuple[pathlib.Path, int]] = []  # each open tracer's path and start: what a stop signal writes


def _native():
    from jaxcoll import runtime  # loads the native module, which holds the events
    if runtime._jaxcoll.trace_event_size() != trace_events.EVENT.itemsize:
        raise ImportError(f"jaxcoll's native module records {runtime._jaxcoll.trace_event_size()}-byte trace events, "
                          f"jaxcoll.observe.trace_events reads {trace_events.EVENT.itemsize}: rebuild the module")
    return runtime._jaxcoll


def _open_tracer(path: pathlib.Path) -> int:
    """Open a tracer writing to `path`; the events' clock now (monotonic ns), where this tracer's events begin."""
    global _open
    native = _native()
    with _lock:
        since = native.trace_clock_ns()[0]  # before the switch: every event it lets through starts after this
        _open += 1
        native.open_tracer()
        _tracers.append((path, since))
    _catch_stop_signals()
    return since


def _close_tracer(path: pathlib.Path, since_ns: int) -> tuple[np.ndarray, int]:
    """Close the tracer of `path` opened at `since_ns`: the events that started since (every thread's), and how
    many were overwritten in full buffers. The last tracer to close forgets the events."""
    global _open
    native = _native()
    with _lock:
        _open -= 1
        _tracers.remove((path, since_ns))
        native.close_tracer()
        data, dropped = native.trace_events(_open == 0)
        last = _open == 0
    if last:
        _release_stop_signals()
    return _since(data, since_ns), int(dropped)


def _since(data: bytes, since_ns: int) -> np.ndarray:
    events = np.frombuffer(data, dtype=trace_events.EVENT)
    return events[events["start_ns"] >= since_ns]


# ---- a process stopped from outside (SIGTERM: a launcher ending a job; SIGINT: Ctrl-C) ----
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_replaced: dict[int, object] = {}  # signal -> the default handler that _on_stop_signal stands in front of


def _catch_stop_signals() -> None:
    """While a trace is open, put _on_stop_signal in front of SIGTERM's and SIGINT's default handlers. A handler
    the program set (or one that ignores the signal, or that native code set) is the program's to keep: one that
    raises or exits still gets the file written, by the block's end or at exit. Python sets handlers from the main
    thread only: a trace opened on another thread catches nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        current = signal.getsignal(sig)
        if current is signal.SIG_DFL or current is signal.default_int_handler:
            signal.signal(sig, _on_stop_signal)
            _replaced[sig] = current


def _release_stop_signals() -> None:
    """The last trace closed: give the signals their handlers back, unless the program has set others since."""
    if threading.current_thread() is not threading.main_thread():
        return  # _on_stop_signal stays, and with no trace open only passes the signal on
    for sig, previous in _replaced.items():
        if signal.getsignal(sig) is _on_stop_signal:
            signal.signal(sig, previous)


def _on_stop_signal(signum: int, frame) -> None:
    """Write every open trace's file (the events so far; the trace goes on should the process survive the
    signal), then pass the signal to the handler it would have had: SIGINT's raises KeyboardInterrupt; SIG_DFL is
    put back and the signal raised again, so the process ends as it would have (its exit status names the
    signal), without running atexit."""
    for path, since in list(_tracers):
        try:
            data, dropped = _native().trace_events(False)
            trace_events.write(process_path(path), _since(data, since), _about_this_process(int(dropped)))
        except Exception as err:  # the process is being stopped: say why the file is missing, and stop it anyway
            print(f"jaxcoll.trace: could not write {path} on {signal.Signals(signum).name}: {err!r}", file=sys.stderr)
    previous = _replaced.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


class trace(contextlib.ContextDecorator):
    """Record every step of every jaxcoll call the CPU runtime or the CUDA executor runs in this process inside the
    block (GPU calls captured into a CUDA graph excepted), and write them to `path` as Chrome/Perfetto trace-event
    JSON when the block ends (also when it ends in an error, such as a call's timeout: the file then shows the
    steps up to the hang), or when SIGTERM or SIGINT stops the process inside it. Open it in
    https://ui.perfetto.dev or chrome://tracing, or draw it with `jaxcoll trace show path --out lanes.png`.

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
        self._since.append(_open_tracer(self.path))
        return self

    def __exit__(self, *exc) -> bool:
        events, dropped = _close_tracer(self.path, self._since.pop())
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
