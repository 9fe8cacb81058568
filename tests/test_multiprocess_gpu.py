"""jaxcoll's GPU path across processes and hosts, as far as it runs without a GPU (docs/cuda.md, "Groups across
processes" and "Across hosts"): what a program over GPUs of several processes and hosts lowers to (which steps
are jaxcoll plans over CUDA IPC, which are network steps on XLA's communicator), and the setup exchange through
which the processes of a host share their CUDA slots, with its faults. Each test launches a jax.distributed job
(jaxcoll.launch) running a case of multiprocess_cases.py. The exchange lives in the CUDA build of the module and
its tests skip without it; the collectives on real GPUs across processes need a machine with several GPUs."""

from __future__ import annotations

import json

import pytest

from jaxcoll import _jaxcoll
from jaxcoll.plan import Collective
from jaxcoll.plan.ir import COLLECTIVE_CODES
from test_multiprocess import assert_all_ok, error_of, job

needs_cuda_build = pytest.mark.skipif(not _jaxcoll.with_cuda, reason="jaxcoll was built without the CUDA executor "
                                      "(the slot exchange is part of it)")


def lowered(result) -> dict:
    out = {}
    for line in result.stdout.splitlines():
        if line.startswith("lowered "):
            _, label, payload = line.split(" ", 2)
            out[label] = json.loads(payload)
    return out


@pytest.fixture(scope="module")
def gpu_lowering():
    # 4 processes x 2 devices on two "hosts" of two processes: mesh ("x", "y") = (2, 4), x across the hosts.
    results = job("gpu_lowering", 4, 2, process_env={p: {"JAXCOLL_HOST": "ab"[p // 2]} for p in range(4)})
    assert_all_ok(results, "gpu_lowering")
    programs = [lowered(r) for r in results]
    assert all(p == programs[0] for p in programs), "every process lowers the same program"
    return programs[0]


def test_a_group_within_a_host_is_one_plan_across_its_processes(gpu_lowering):
    # all_reduce over "y": each group is one host's two processes, reached through CUDA IPC by one plan.
    assert gpu_lowering["within_host"] == {"calls": [
        {"target": "jaxcoll_all_reduce", "processes": [0, 0, 1, 1, 2, 2, 3, 3]}]}


def network(collective, groups, group_size, root=0, pairs=()) -> dict:
    """A `jaxcoll_network` call as the case reports it: its attributes (xla_ffi/cuda_network.hpp)."""
    return {"target": "jaxcoll_network", "collective": COLLECTIVE_CODES[collective], "groups": groups,
            "group_size": group_size, "root": root, "pairs": list(pairs)}


RAILS = [0, 4, 1, 5, 2, 6, 3, 7]  # rank l of each host: devices (l, 4 + l)
WHOLE = list(range(8))  # the group in rank order: XLA's communicator ranks are the group's ranks


def test_all_reduce_across_hosts_is_host_plans_around_a_network_step_on_the_rails(gpu_lowering):
    # ranks 0-3 on host a (processes 0, 1), 4-7 on host b (processes 2, 3): a reduce_scatter plan within each
    # host, the network all_reduce over the rails, an all_gather plan.
    assert gpu_lowering["all_reduce"] == {"calls": [
        {"target": "jaxcoll_reduce_scatter", "processes": [0, 0, 1, 1, 2, 2, 3, 3]},
        network(Collective.ALL_REDUCE, RAILS, 2),
        {"target": "jaxcoll_all_gather", "processes": [0, 0, 1, 1, 2, 2, 3, 3]}]}


def test_reduce_scatter_and_all_gather_across_hosts(gpu_lowering):
    assert gpu_lowering["reduce_scatter"]["calls"][1:] == [network(Collective.REDUCE_SCATTER, RAILS, 2)]
    assert gpu_lowering["reduce_scatter"]["calls"][0]["target"] == "jaxcoll_reduce_scatter"
    # all_gather over "x" alone: one GPU per host in each group, so the network step is all there is.
    assert gpu_lowering["all_gather_rails"] == {"calls": [network(Collective.ALL_GATHER, RAILS, 2)]}


def test_all_to_all_across_hosts_is_one_network_step_over_the_whole_group(gpu_lowering):
    assert gpu_lowering["all_to_all"] == {"calls": [network(Collective.ALL_TO_ALL, WHOLE, 8)]}


def test_broadcast_across_hosts_is_one_network_step_from_the_root(gpu_lowering):
    assert gpu_lowering["broadcast"] == {"calls": [network(Collective.BROADCAST, WHOLE, 8, root=5)]}


def test_ppermute_across_hosts_is_one_network_step_carrying_the_pairs(gpu_lowering):
    # (source, target) interleaved: rank r of host a sends to rank r + 4 on host b.
    assert gpu_lowering["ppermute"] == {"calls": [
        network(Collective.PPERMUTE, WHOLE, 8, pairs=[0, 4, 1, 5, 2, 6, 3, 7])]}


def test_a_named_plan_for_a_group_across_hosts_is_refused_naming_the_algorithm(gpu_lowering):
    assert "algorithm='direct' names one plan for the whole group" in gpu_lowering["all_to_all_algorithm"]["error"]


def test_network_steps_without_the_collectives_extension_fail_at_trace_time_saying_what_is_needed(gpu_lowering):
    available = _jaxcoll.with_cuda and _jaxcoll.network_steps()[0]
    if available:
        assert [c["target"] for c in gpu_lowering["network_missing"]["calls"]][1] == "jaxcoll_network"
    elif _jaxcoll.with_cuda:  # built against a jaxlib whose FFI headers lack the extension (0.10.2 here)
        assert "cannot run its network steps" in gpu_lowering["network_missing"]["error"]
        assert "collectives extension" in gpu_lowering["network_missing"]["error"]
    else:
        assert "built without the CUDA executor" in gpu_lowering["network_missing"]["error"]


# -- the setup exchange of a CUDA group spanning the processes of a host (csrc/cuda/slot_exchange.hpp) --------

@needs_cuda_build
def test_processes_that_agree_complete_the_exchange():
    results = job("exchange_agree", 2, 1)
    for r in results:
        if "blocks" in r.stdout:  # a machine with a GPU: the group runs the fewest blocks any process allows
            assert "blocks 2" in r.stdout
        else:  # no driver: the agreement passed, and the first CUDA call (registering the error record) failed
            assert "cudaHostRegister" in error_of(r)[1], r.stdout


@needs_cuda_build
def test_a_process_with_another_plan_is_named_by_every_process():
    results = job("exchange_different_plan", 2, 1)
    for r, other in zip(results, (1, 0)):
        assert f"process {other} (pid" in error_of(r)[1]
        assert "runs a different plan or shape at this call site" in error_of(r)[1]


@needs_cuda_build
def test_two_ranks_on_one_gpu_are_refused_naming_both():
    results = job("exchange_same_gpu", 2, 1)
    message = error_of(results[0])[1]
    assert "ranks 0 (process 0) and 2 (process 1) run on the same GPU gpu-0" in message


@needs_cuda_build
def test_a_process_that_never_sets_up_is_named_after_the_timeout():
    seconds, message = error_of(job("exchange_never", 2, 1)[0])
    assert "never arrived: process 1 (pid" in message and "ranks [2, 3] of this group" in message
    assert 3.0 <= seconds < 20.0


@needs_cuda_build
def test_a_process_that_exits_before_setting_up_is_named_at_once():
    seconds, message = error_of(job("exchange_exits", 2, 1)[0])
    assert "process 1 (pid" in message and "has exited before setting up its GPUs" in message
    assert seconds < 2.5


def _gpus() -> tuple[int, str]:
    if not _jaxcoll.with_cuda:
        return 0, "jaxcoll was built without the CUDA executor"
    return _jaxcoll.cuda_device_count()


@pytest.mark.skipif(_gpus()[0] < 2, reason=f"needs 2 GPUs, one per process (CUDA IPC between them): {_gpus()}")
def test_collectives_across_processes_on_gpus_equal_xla_and_numpy():
    # The CPU suite's case, on one GPU per process: every collective over an axis across the two processes
    # against XLA's own (NCCL) and numpy, through the CUDA executor's groups spanning processes.
    results = job("collectives", 2, 1, process_env={p: {"CUDA_VISIBLE_DEVICES": str(p)} for p in range(2)})
    assert_all_ok(results, "collectives")


def _network_steps() -> tuple[bool, str]:
    if not _jaxcoll.with_cuda:
        return False, "jaxcoll was built without the CUDA executor"
    return _jaxcoll.network_steps()


@pytest.mark.skipif(_gpus()[0] < 2 or not _network_steps()[0],
                    reason=f"needs 2 GPUs and a jaxcoll built against a jaxlib with XLA's FFI collectives extension "
                           f"(0.11.2 or later): GPUs {_gpus()}, network steps {_network_steps()}")
@pytest.mark.parametrize("gpus_per_process", [1, 2])
def test_collectives_across_gpu_hosts_equal_xla_and_numpy(gpus_per_process):
    # Two processes told they are on two hosts (JAXCOLL_HOST): every group across them runs its steps across
    # "hosts" on XLA's NCCL communicator (all six collectives: rails for all_reduce, reduce_scatter, all_gather,
    # one whole-group network phase for all_to_all, broadcast, ppermute), against XLA's own and numpy. With 2 GPUs
    # a process the rail collectives also run their host-local plans (peer memory within the process).
    if _gpus()[0] < 2 * gpus_per_process:
        pytest.skip(f"needs {2 * gpus_per_process} GPUs, has {_gpus()[0]}")
    env = {p: {"JAXCOLL_HOST": "ab"[p],
               "CUDA_VISIBLE_DEVICES": ",".join(str(p * gpus_per_process + g) for g in range(gpus_per_process))}
           for p in range(2)}
    assert_all_ok(job("collectives", 2, gpus_per_process, process_env=env), "collectives")
