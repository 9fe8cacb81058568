"""The topology of the running JAX job: hosts x processes x local devices (docs/multiprocess.md).

Ranks are the job's devices in the order given (by default `jax.devices()`, the global order of a mesh over every
device); each process is a box, since a process's ranks share its address space while a plan's steps between
processes cross shared-memory segments (one host) or the network transport (other hosts). Switches and links:

    rank  <-> "process p"   memory_GBps         a rank's copies inside its process
    "process p" <-> "host h"    shared_memory_GBps  chunks that cross processes of one host (segments)
    "host h" <-> "network"      network_GBps        the TCP connections between hosts

so a transfer inside a process costs one memory hop each way, between processes of a host two more, between
hosts two more again. The synthesizers and the simulator take it like any preset: `synthesize(job(), ...)` gives a
plan for the job that runs across its processes as given (`algorithm=plan`).

The default numbers are this runtime's on CPU devices: one core's copy rate (as `topology.cpu`), about half of it
through the segments (every crossing chunk is copied in or out once more), and 10 GbE between hosts. Other
platforms have no defaults: pass the numbers of the machine.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxcoll.topology.errors import TopologyError
from jaxcoll.topology.graph import Topology

CPU_MEMORY_GBPS, CPU_MEMORY_LATENCY_US = 8.0, 0.25  # as presets.cpu: one core's memcpy, half a semaphore round trip
CPU_SHARED_MEMORY_GBPS, SHARED_MEMORY_LATENCY_US = 4.0, 1.0  # a copy through a segment on each crossing
NETWORK_GBPS, NETWORK_LATENCY_US = 1.25, 10.0  # 10 GbE; a TCP message through two progress threads


def job(devices: Sequence | None = None, *, hosts: Sequence[int] | None = None,
        memory_GBps: float | None = None, shared_memory_GBps: float | None = None,
        network_GBps: float = NETWORK_GBPS) -> Topology:
    """The topology of `devices` (default `jax.devices()`): one box per process, processes grouped by host.

    `hosts[p]` is the host of process p; by default the job's own (`jaxcoll.distributed.layout()`, which waits
    for every process's part of the job when it has several), one host when it has one process.
    Bandwidths are per direction in GB/s; the memory ones default to the CPU runtime's and must be given for
    other platforms."""
    import jax
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise TopologyError("devices must name at least one device, got none")
    platforms = {d.platform for d in devices}
    if platforms != {"cpu"} and (memory_GBps is None or shared_memory_GBps is None):
        raise TopologyError(f"job(): devices of platform {sorted(platforms)} have no default link numbers; pass "
                            f"memory_GBps and shared_memory_GBps (got {memory_GBps!r} and {shared_memory_GBps!r})")
    memory_GBps = CPU_MEMORY_GBPS if memory_GBps is None else memory_GBps
    shared_memory_GBps = CPU_SHARED_MEMORY_GBPS if shared_memory_GBps is None else shared_memory_GBps
    ranks = [int(d.process_index) for d in devices]
    if hosts is None:
        hosts = _job_hosts(max(ranks) + 1)
    return layout(ranks, hosts, memory_GBps=memory_GBps, shared_memory_GBps=shared_memory_GBps,
                  network_GBps=network_GBps)


def layout(processes: Sequence[int], hosts: Sequence[int] | None = None, *, memory_GBps: float = CPU_MEMORY_GBPS,
           shared_memory_GBps: float = CPU_SHARED_MEMORY_GBPS, network_GBps: float = NETWORK_GBPS) -> Topology:
    """The topology of a group whose rank r runs in process `processes[r]`, process p on host `hosts[p]`
    (default: one host): what `job` builds from the job's devices, for any group layout and without JAX."""
    ranks = [int(p) for p in processes]
    if not ranks:
        raise TopologyError("processes must name the process of at least one rank, got none")
    processes = sorted(set(ranks))
    hosts = [0] * (max(processes) + 1) if hosts is None else [int(h) for h in hosts]
    if len(hosts) <= max(processes):
        raise TopologyError(f"hosts must name the host of every process 0..{max(processes)}, got hosts={hosts}")
    used_hosts = sorted({hosts[p] for p in processes})

    switches = [f"process {p}" for p in processes] + [f"host {h}" for h in used_hosts]
    links: list[tuple] = []

    def duplex(a, b, bw, lat):
        links.extend([(a, b, bw, lat), (b, a, bw, lat)])

    for r, p in enumerate(ranks):
        duplex(r, f"process {p}", memory_GBps, CPU_MEMORY_LATENCY_US)
    for p in processes:
        duplex(f"process {p}", f"host {hosts[p]}", shared_memory_GBps, SHARED_MEMORY_LATENCY_US)
    if len(used_hosts) > 1:
        switches.append("network")
        for h in used_hosts:
            duplex(f"host {h}", "network", network_GBps, NETWORK_LATENCY_US)
    boxes = [[r for r, q in enumerate(ranks) if q == p] for p in processes]
    name = f"job{len(used_hosts)}x{len(processes)}x{len(ranks)}"
    return Topology(name, len(ranks), switches, links, boxes, memory_bandwidth_GBps=memory_GBps)


def _job_hosts(nprocesses: int) -> list[int]:
    """The host index of each process of the running job (one host for a single process)."""
    if nprocesses == 1:
        return [0]
    from jaxcoll import distributed
    world = distributed.layout()
    if world is None or world.nprocesses != nprocesses:
        raise TopologyError(f"the devices name {nprocesses} processes but this job has "
                            f"{1 if world is None else world.nprocesses}; pass hosts= for devices of another job")
    return list(world.hosts)
