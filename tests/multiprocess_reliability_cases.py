"""The reliability cases of jaxcoll across processes (issue 32; test_multiprocess.py runs them): recompiling, threads
that dispatch at once, processes in namespaces of their own, shapes that differ between processes, a stalled
peer, strangers on the network port. Run as `python multiprocess_reliability_cases.py CASE` in every process of a
job, like multiprocess_cases.py, whose job setup, meshes, references and fault reporting these share.
"""

from __future__ import annotations

import os
import sys
import time

from multiprocess_cases import (PROCESS, _fault_call, _report, _segment_prefix, local_values, mesh_1d, put,
                                reference)

import jax  # noqa: E402, I001 - after the job is joined (multiprocess_cases joins it)
import jax.experimental.multihost_utils  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxcoll  # noqa: E402
import jaxcoll.distributed  # noqa: E402


def _segments_and_mappings() -> tuple[int, int]:
    """(jaxcoll segments this process created that are in /dev/shm, jaxcoll segments it has mapped)."""
    mine = [f for f in os.listdir("/dev/shm") if f.startswith(_segment_prefix()) and not f.endswith("-alive")]
    with open("/proc/self/maps") as f:
        mapped = {line[line.index("/dev/shm/jaxcoll-"):].split()[0] for line in f if "/dev/shm/jaxcoll-" in line}
    return len(mine), len(mapped)


def _summed(rows_per_rank: int):
    """(mesh, numpy's all_reduce of the global input, the input put on the mesh) for an all_reduce over "i" of
    `rows_per_rank` small integers a rank."""
    mesh = mesh_1d()
    x_np = (np.arange(mesh.devices.size * rows_per_rank) % 7).astype(np.float32)
    return mesh, reference("sum", mesh, ("i",), x_np), put(x_np, mesh)


def case_recompiles() -> str:
    """An all_reduce compiled 32 times (jax.clear_caches() after each) and 8 steps of a replacing_collectives block
    (which clears the caches on entry and exit) leave no more segments and mappings than one compilation did: a
    dropped executable frees what its call sites held."""
    import gc
    mesh, want, x = _summed(1 << 18)  # 1 MiB a rank

    spec = P("i")

    def step(fn):
        f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec))
        for index, value in local_values(f(x)).items():
            np.testing.assert_array_equal(value, want[tuple(slice(a, b) for a, b in index)], err_msg=f"at {index}")
        return f

    f = step(lambda v: jaxcoll.all_reduce(v, "i"))
    live = _segments_and_mappings()
    assert live[0] > 0 and live[1] > 0, f"a live call site holds no segment: {live}"
    del f
    jax.clear_caches()
    gc.collect()
    once = _segments_and_mappings()
    for _ in range(32):
        step(lambda v: jaxcoll.all_reduce(v, "i"))
        jax.clear_caches()
        gc.collect()
    recompiled = _segments_and_mappings()
    assert recompiled[0] <= once[0] and recompiled[1] <= once[1], \
        f"(segments, mappings): {once} after one compilation, {recompiled} after 33"
    for _ in range(8):
        with jaxcoll.replacing_collectives():
            step(lambda v: lax.psum(v, "i"))
        gc.collect()
    stepped = _segments_and_mappings()
    assert stepped[0] <= once[0] and stepped[1] <= once[1], \
        f"(segments, mappings): {once} after one compilation, {stepped} after 8 replacing_collectives steps"
    return f"(segments, mappings) live {live}, dropped {once}, after 33 compilations {recompiled}, " \
           f"after 8 steps {stepped}"


def case_namespaces() -> str:
    """An all_reduce across the processes, process 1 in a pid or mount namespace of its own (CASE_UNSHARE, at the
    top): values as numpy's in every call, and process 1's cleaner of stale segments leaves process 0's alone."""
    from jaxcoll import runtime
    mesh, want, x = _summed(256)
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.all_reduce(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))

    def call_and_check():
        for index, value in local_values(f(x)).items():
            np.testing.assert_array_equal(value, want[tuple(slice(a, b) for a, b in index)], err_msg=f"at {index}")
    for _ in range(3):
        call_and_check()
        time.sleep(0.2)  # calls that wait: a peer taken for gone fails them
    removed = runtime._jaxcoll.clean_stale_segments() if PROCESS == 1 else 0
    jax.experimental.multihost_utils.sync_global_devices("cleaned")
    if PROCESS == 0:
        mine = sorted(f for f in os.listdir("/dev/shm") if f.startswith(_segment_prefix()))
        assert any(f.endswith("-alive") for f in mine) and len(mine) >= 3, f"process 0's segments: {mine}"
    call_and_check()
    return f"hosts {jaxcoll.distributed.world().hosts}, pid {os.getpid()}, removed {removed}"


def case_threads() -> str:
    """Two threads of each process dispatch one jaxcoll function 20 times each, at once: every call completes,
    equal to numpy (the launches of the two threads interleave differently in each process). The all_reduce runs
    the plan JAXCOLL_TEST_ALGORITHM names (default auto)."""
    import threading
    mesh, want, x = _summed(1024)
    algorithm = os.environ.get("JAXCOLL_TEST_ALGORITHM", "auto")
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.all_reduce(v, "i", algorithm=algorithm), mesh=mesh, in_specs=P("i"),
                              out_specs=P("i")))
    f(x).block_until_ready()
    errors = []

    def dispatch():
        try:
            for _ in range(20):
                for index, value in local_values(f(x)).items():
                    np.testing.assert_array_equal(value, want[tuple(slice(a, b) for a, b in index)])
        except Exception as e:  # reported below, from the main thread
            errors.append(e)
    threads = [threading.Thread(target=dispatch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return "2 threads x 20 calls"


def _differs(dtype0, dtype1, rows0, rows1) -> None:
    """Process 0 calls one all_reduce call site with `rows0` elements a rank of `dtype0`, process 1 with `rows1` of
    `dtype1`: each prints the error it got."""
    mesh = mesh_1d()
    dtype, rows = (dtype0, rows0) if PROCESS == 0 else (dtype1, rows1)
    local = np.ones((len(jax.local_devices()) * rows,), dtype)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.all_reduce(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    _report(lambda: f(x).block_until_ready(), everyone_reports=True)


def case_dtype_differs() -> str:
    _differs(np.float32, np.int32, 1024, 1024)


def case_bfloat16_differs() -> str:
    _differs(np.float32, jnp.bfloat16, 1024, 1024)


def case_size_differs() -> str:
    _differs(np.float32, np.float32, 1024, 512)


def case_stalled_mid_call() -> str:
    """Process 1 arrives at a call and is stopped (SIGSTOP) before process 0 arrives: process 0 waits on it until
    the timeout, reports, and resumes it (SIGCONT) so the job can end."""
    import signal
    import threading
    f, x = _fault_call()
    f = f.lower(x).compile()  # both compile before either waits: the timeout is short
    jax.experimental.multihost_utils.sync_global_devices("stalled_mid_call compiled")
    f(x).block_until_ready()
    if PROCESS == 1:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGSTOP)).start()
        _report(lambda: f(x).block_until_ready())
    time.sleep(1.5)

    def call_then_resume():
        try:
            f(x).block_until_ready()
        finally:
            os.kill(jaxcoll.distributed.world().pids[1], signal.SIGCONT)
    _report(call_then_resume)


def case_strangers() -> str:
    """Five connections that never say a word reach process 1's network port before process 0's own: the job still
    sets up (process 1 closes each after its hello deadline, counted and logged), and the port listens at the
    address published only (127.0.0.1 here: 127.0.0.2, also this machine, is refused)."""
    import json
    import socket
    import threading

    from jaxcoll import _jax, runtime
    strangers, ready = [], threading.Event()
    if PROCESS == 0:
        def connect_strangers():
            peer = json.loads(_jax.distributed_client().blocking_key_value_get("jaxcoll/v1/net/1", 60_000))
            for _ in range(5):
                strangers.append(socket.create_connection((peer["address"], peer["port"]), timeout=10))
            ready.set()
        threading.Thread(target=connect_strangers, daemon=True).start()
        connect = runtime.net_connect

        def after_strangers(*args):  # process 0's own connection to process 1 comes after the strangers'
            assert ready.wait(60), "the strangers could not connect"
            connect(*args)
        runtime.net_connect = after_strangers
    jaxcoll.distributed.connect()
    f, x = _fault_call()
    f(x).block_until_ready()
    while PROCESS == 1 and runtime._jaxcoll.net_refused() < 5:  # the strangers stay silent until refused
        time.sleep(0.05)
    jax.experimental.multihost_utils.sync_global_devices("strangers refused")
    for s in strangers:
        s.close()
    if PROCESS == 0:
        peer = json.loads(_jax.distributed_client().blocking_key_value_get("jaxcoll/v1/net/1", 10_000))
        assert peer["address"] == "127.0.0.1", peer
        try:
            socket.create_connection(("127.0.0.2", peer["port"]), timeout=10).close()
            raise AssertionError("process 1's port answered at 127.0.0.2: it listens beyond the address published")
        except ConnectionRefusedError:
            pass
    jax.experimental.multihost_utils.sync_global_devices("bind checked")
    return f"refused {runtime._jaxcoll.net_refused()}"


if __name__ == "__main__":
    name = sys.argv[1]
    result = globals()[f"case_{name}"]()
    print("ok", name, result, flush=True)
    jax.distributed.shutdown()
