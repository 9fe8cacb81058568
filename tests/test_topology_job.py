"""jaxcoll.topology.job: the topology of a job's hosts x processes x devices, built from device objects (one box
per process, a host switch per host, a network switch only across hosts), with its routes and bandwidths as the
docstring lays them out, and the bad inputs it refuses."""

import dataclasses

import jax
import pytest

from jaxcoll import synth
from jaxcoll.lang import check
from jaxcoll.topology import TopologyError, job
from jaxcoll.topology.job import CPU_MEMORY_GBPS, CPU_SHARED_MEMORY_GBPS, NETWORK_GBPS


@dataclasses.dataclass(frozen=True)
class Device:
    id: int
    process_index: int
    platform: str = "cpu"


def devices(nprocesses: int, per: int, platform: str = "cpu") -> list[Device]:
    return [Device(i, i // per, platform) for i in range(nprocesses * per)]


def test_one_process_is_one_box_without_network():
    t = job(jax.devices())
    assert t.nranks == len(jax.devices()) and t.boxes == (tuple(range(t.nranks)),)
    assert "network" not in t.switches
    assert t.path_bandwidth_GBps(0, 1) == CPU_MEMORY_GBPS


@pytest.mark.parametrize("hosts", [[0, 0], [0, 1], [3, 3, 7, 7]])
def test_boxes_are_processes_and_paths_cross_the_switches_between_them(hosts):
    nprocesses = len(hosts)
    per = 8 // nprocesses
    t = job(devices(nprocesses, per), hosts=hosts)
    assert t.boxes == tuple(tuple(range(p * per, (p + 1) * per)) for p in range(nprocesses))

    def names(a, b):  # the nodes a transfer from rank a to rank b passes, in order
        links = [t.links[i] for i in t.route(a, b)]
        return [t.node_name(links[0].src)] + [t.node_name(link.dst) for link in links]
    assert names(0, 1) == ["0", "process 0", "1"]
    last = t.nranks - 1
    if hosts[0] == hosts[-1]:
        assert names(0, last) == ["0", "process 0", f"host {hosts[0]}", f"process {nprocesses - 1}", str(last)]
        assert t.path_bandwidth_GBps(0, last) == CPU_SHARED_MEMORY_GBPS
    else:
        assert names(0, last) == ["0", "process 0", f"host {hosts[0]}", "network", f"host {hosts[-1]}",
                                  f"process {nprocesses - 1}", str(last)]
        assert t.path_bandwidth_GBps(0, last) == NETWORK_GBPS
    assert ("network" in t.switches) == (len(set(hosts)) > 1)


def test_plans_synthesized_for_a_job_are_proved():
    t = job(devices(2, 4), hosts=[0, 1])
    for collective in ("all_reduce", "all_gather", "reduce_scatter"):
        check(synth.synthesize(t, collective, 1 << 20))


def test_bad_inputs_are_named():
    with pytest.raises(TopologyError, match="hosts must name the host of every process 0..1, got hosts=\\[0\\]"):
        job(devices(2, 4), hosts=[0])
    with pytest.raises(TopologyError, match="platform \\['gpu'\\] have no default link numbers; pass memory_GBps"):
        job(devices(2, 4, "gpu"), hosts=[0, 0])
    with pytest.raises(TopologyError, match="at least one device"):
        job([])
    t = job(devices(2, 4, "gpu"), hosts=[0, 0], memory_GBps=300.0, shared_memory_GBps=50.0)
    assert t.path_bandwidth_GBps(0, 7) == 50.0
