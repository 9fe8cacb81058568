"""Start a jax.distributed job of N processes on this machine (the multi-process benchmark and tests use it).

`launch(n, argv)` runs `python argv...` N times with the job described in the environment; each process calls
`initialize()` first, which sets its CPU device count and joins the job through `jax.distributed.initialize`
on a coordinator at a free localhost port. Every process's exit code and output come back; a job that outlives
its timeout is killed whole, so a hang in any process ends as a result, never as a stuck caller.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

_COORDINATOR = "JAXCOLL_LAUNCH_COORDINATOR"
_NPROCESSES = "JAXCOLL_LAUNCH_NPROCESSES"
_PROCESS = "JAXCOLL_LAUNCH_PROCESS"
_DEVICES = "JAXCOLL_LAUNCH_DEVICES"


@dataclasses.dataclass
class ProcessResult:
    process: int
    returncode: int | None  # None: killed at the job's timeout
    stdout: str
    stderr: str
    pid: int = 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nprocesses: int, argv: Sequence[str], *, local_devices: int = 4, timeout_s: float = 600.0,
           env: Mapping[str, str] | None = None,
           process_env: Mapping[int, Mapping[str, str]] | None = None) -> list[ProcessResult]:
    """Run `sys.executable *argv` as processes 0..nprocesses-1 of one jax.distributed job, each with
    `local_devices` CPU devices; `env` is added to every process's environment and `process_env[p]` to process
    p's. Returns when every process has exited, or kills them all after `timeout_s`."""
    if nprocesses < 1:
        raise ValueError(f"launch: nprocesses must be at least 1, got nprocesses={nprocesses}")
    if local_devices < 1:
        raise ValueError(f"launch: local_devices must be at least 1, got local_devices={local_devices}")
    coordinator = f"127.0.0.1:{free_port()}"
    procs, files = [], []
    for p in range(nprocesses):
        e = dict(os.environ)
        e.update(env or {})
        e.update((process_env or {}).get(p, {}))
        e.update({_COORDINATOR: coordinator, _NPROCESSES: str(nprocesses), _PROCESS: str(p),
                  _DEVICES: str(local_devices)})
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        files.append((out, err))
        procs.append(subprocess.Popen([sys.executable, *argv], stdout=out, stderr=err, env=e,
                                      start_new_session=True))
    deadline = time.monotonic() + timeout_s
    codes: list[int | None] = [None] * nprocesses
    while time.monotonic() < deadline and any(c is None for c in codes):
        for p, proc in enumerate(procs):
            if codes[p] is None:
                codes[p] = proc.poll()
        time.sleep(0.05)
    for p, proc in enumerate(procs):
        if codes[p] is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    results = []
    for p, (out, err) in enumerate(files):
        out.seek(0)
        err.seek(0)
        results.append(ProcessResult(p, codes[p], out.read(), err.read(), procs[p].pid))
        out.close()
        err.close()
    return results


def in_job() -> bool:
    """Whether this process was started by `launch`."""
    return _COORDINATOR in os.environ


def initialize() -> tuple[int, int]:
    """In a process started by `launch`: set the CPU device count and join the job. Returns (process index,
    number of processes). Must run before anything touches a JAX backend."""
    import jax
    if not in_job():
        raise RuntimeError("jaxcoll.launch.initialize: this process was not started by jaxcoll.launch.launch "
                           f"({_COORDINATOR} is not set)")
    process, n = int(os.environ[_PROCESS]), int(os.environ[_NPROCESSES])
    jax.config.update("jax_num_cpu_devices", int(os.environ[_DEVICES]))
    jax.distributed.initialize(os.environ[_COORDINATOR], num_processes=n, process_id=process)
    return process, n


def start(devices: int) -> int:
    """This process's index, once JAX is set up: in a process started by `launch`, the job joined (its CPU
    device count is the launcher's); otherwise `devices` emulated CPU devices here (effective only before a
    backend starts; real GPUs are left alone). Must run before anything touches a JAX backend."""
    if in_job():
        return initialize()[0]
    import jax
    jax.config.update("jax_num_cpu_devices", devices)
    return 0

