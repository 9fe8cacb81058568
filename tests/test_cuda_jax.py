"""jaxcoll's collectives under jax.jit(shard_map) on a GPU: the CUDA handler registered for XLA's "CUDA" platform,
reached through the same jaxcoll.all_reduce as on CPU. With one GPU the mesh has one device, so the lowering is
told to emit the custom call even for a one-rank group: registration, lowering, the handler's initialize and
execute stages, the executor kernel and XLA's CUDA graphs are exercised end to end on the single-rank path.

The checks (tests/cuda_jax_cases.py: the six collectives, gradients, a scan of 200 steps, the fused ops, each
against jax.lax; a replaced ragged_all_to_all against the lax contract) run on the CPU device everywhere and on the GPU where there is one; on the GPU they also run in
a process of their own with XLA's command buffers (CUDA graphs) forced on, and with them off. The GPU tests skip
with the reason where jax has no GPU backend or jaxcoll no CUDA executor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import cuda_jax_cases as cases
import jaxcoll
from jaxcoll import runtime
from jaxcoll.lowering import custom_call

ROOT = Path(__file__).resolve().parents[1]


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


def device_of(platform):
    return jax.devices("cpu")[0] if platform == "cpu" else _gpus()[0]


PLATFORMS = ["cpu", pytest.param("cuda", marks=needs_gpu)]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_six_collectives_equal_jax_lax(single_rank_calls, platform):
    cases.check_collectives(device_of(platform))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_gradients_through_the_collectives_equal_jax_lax(single_rank_calls, platform):
    cases.check_gradients(device_of(platform))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_scan_of_200_steps_equals_jax_lax(single_rank_calls, platform):
    cases.check_scan(device_of(platform), steps=200)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_fused_ops_equal_their_jax_lax_compositions(single_rank_calls, platform):
    cases.check_fused(device_of(platform))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_replaced_ragged_all_to_all_equals_the_lax_contract(single_rank_calls, platform):
    cases.check_ragged(device_of(platform))


# XLA_FLAGS for XLA's command buffers (CUDA graphs): forced on for custom calls down to one-op sequences (XLA
# captures command-buffer-compatible custom calls, which jaxcoll's CUDA handler declares itself), and off.
COMMAND_BUFFERS = {"on": "--xla_gpu_graph_min_graph_size=1 --xla_gpu_enable_command_buffer=+CUSTOM_CALL",
                   "off": "--xla_gpu_enable_command_buffer="}


def run_cases_programs(platform: str) -> dict[str, str]:
    """tests/cuda_jax_cases.py under each setting of COMMAND_BUFFERS, the processes at once (each mostly compiles
    on the host): {setting: its output}."""
    # This process's GPU client already holds XLA's default 75 % of the GPU's memory: the children take what
    # they need instead of failing to take another 75 % each.
    base = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    running = {}
    for setting, flags in COMMAND_BUFFERS.items():
        env = dict(base, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())
        running[setting] = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "cuda_jax_cases.py"), "--platform", platform], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outputs = {}
    try:
        for setting, process in running.items():
            outputs[setting] = process.communicate(timeout=300)[0]
            assert process.returncode == 0, f"command buffers {setting}:\n{outputs[setting]}"
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return outputs


def checks_passed(out: str) -> list[str]:
    return [line.split(":")[0].removeprefix("ok ") for line in out.splitlines() if line.startswith("ok ")]


@needs_gpu
def test_every_check_holds_with_xla_command_buffers_on_and_off():
    for setting, out in run_cases_programs("cuda").items():
        assert checks_passed(out) == list(cases.CHECKS), f"command buffers {setting}:\n{out}"


def test_the_cases_program_runs_every_check_and_refuses_an_unknown_one():
    """The programs the command-buffer test starts, on the CPU device (the GPU flags are inert there)."""
    for setting, out in run_cases_programs("cpu").items():
        assert checks_passed(out) == list(cases.CHECKS), f"command buffers {setting}:\n{out}"
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "cuda_jax_cases.py"), "--checks", "scan,bogus"],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "['bogus']" in done.stderr


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
