"""jaxcoll's collectives under jax.jit(shard_map) on a GPU: the CUDA handler registered for XLA's "CUDA" platform,
reached through the same jaxcoll.all_reduce as on CPU. With one GPU the mesh has one device, so the lowering is
told to emit the custom call even for a one-rank group: registration, lowering, the handler's initialize and
execute stages, the executor kernel and XLA's CUDA graphs are exercised end to end on the single-rank path.

The GPU tests skip with the reason where jax has no GPU backend or jaxcoll no CUDA executor; the lowering of
one-rank groups through the runtime is also checked on CPU, which runs everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxcoll
from jaxcoll import runtime
from jaxcoll.lowering import custom_call


def _gpus():
    try:
        return jax.devices("cuda")
    except RuntimeError:
        return []


def _skip_reason():
    usable, why = runtime.cuda_status()
    if not usable:
        return why
    if not _gpus():
        return "jax has no CUDA backend here (no jax CUDA plugin, or no GPU)"
    return ""


needs_gpu = pytest.mark.skipif(bool(_skip_reason()), reason=_skip_reason() or "GPU present")


@pytest.fixture
def single_rank_calls(monkeypatch):
    monkeypatch.setattr(custom_call, "lower_single_rank_groups", True)


def one_device_collectives(device):
    mesh = jax.make_mesh((1,), ("i",), devices=[device])

    def body(x):
        return (jaxcoll.all_reduce(x, "i"), jaxcoll.all_reduce(x, "i", op="max"), jaxcoll.all_gather(x, "i", tiled=True),
                jaxcoll.reduce_scatter(x, "i", tiled=True))

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    x = jax.device_put(np.arange(4 * 33, dtype=np.float32).reshape(4, 33), NamedSharding(mesh, P("i")))
    return f, x


def check_identity(f, x):
    hlo = f.lower(x).as_text()
    assert "jaxcoll_all_reduce" in hlo and "jaxcoll_all_gather" in hlo
    want = np.asarray(x)
    for _ in range(3):  # repeated calls: the group's counters advance on the device
        for got in f(x):
            np.testing.assert_array_equal(np.asarray(got).reshape(want.shape), want)


def test_one_rank_groups_lower_through_the_runtime_on_cpu(single_rank_calls):
    check_identity(*one_device_collectives(jax.devices("cpu")[0]))


@needs_gpu
def test_one_gpu_mesh_runs_the_cuda_handler(single_rank_calls):
    check_identity(*one_device_collectives(_gpus()[0]))


@needs_gpu
def test_the_cuda_handler_runs_inside_xla_cuda_graphs():
    """XLA captures command-buffer-compatible custom calls into CUDA graphs; force graphs for every sequence."""
    script = textwrap.dedent("""
        import jax, numpy as np, jaxcoll
        from jax.sharding import NamedSharding, PartitionSpec as P
        from jaxcoll.lowering import custom_call
        custom_call.lower_single_rank_groups = True
        mesh = jax.make_mesh((1,), ("i",), devices=jax.devices("cuda")[:1])
        f = jax.jit(jax.shard_map(lambda x: jaxcoll.all_reduce(x * 2, "i") + 1, mesh=mesh, in_specs=P("i"),
                                  out_specs=P("i")))
        x = jax.device_put(np.arange(1024, dtype=np.float32), NamedSharding(mesh, P("i")))
        for _ in range(5):
            np.testing.assert_array_equal(np.asarray(f(x)), np.arange(1024, dtype=np.float32) * 2 + 1)
        print("ok")
    """)
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_gpu_graph_min_graph_size=1"
                                      " --xla_gpu_enable_command_buffer=+CUSTOM_CALL").strip())
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout + done.stderr
