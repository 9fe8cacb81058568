"""Collectives over GPUs of several hosts (docs/cuda.md, "Across hosts"): within each host, then across, then within.

A plan on jaxcoll's CUDA executor reaches the GPUs of one host only (peer memory in a process, CUDA IPC between
the processes of the host). jaxcoll writes no network stack for GPUs: the steps that cross hosts are collectives
run on XLA's own communicator (NCCL), which newer XLA lends to FFI handlers through its collectives extension
(target `jaxcoll_network`, xla_ffi/cuda_network.hpp). A collective whose group spans hosts is therefore a short
schedule of *phases*, each a collective over sub-groups of the group's ranks:

- an **ipc** phase runs a jaxcoll plan (chosen by `jaxcoll.algorithms.select`, as any call) over the ranks of one
  host, each sub-group one host;
- a **network** phase runs one NCCL collective over the *rails*: the ranks with the same position on each host,
  one per host, as NCCL's own hierarchical algorithms pair them, so every GPU drives its own NIC.

With H hosts of L ranks each (rank (h, l) is the l-th rank of host h, in rank order; S bytes per rank):

| collective | phases | bytes a rank sends across hosts |
|---|---|---|
| all_reduce | ipc reduce_scatter, network all_reduce (S/L per rank), ipc all_gather | 2 (H-1)/H * S/L |
| reduce_scatter | input blocks rearranged to [l][h], ipc reduce_scatter, network reduce_scatter | (H-1)/H * S/L |
| all_gather | network all_gather, ipc all_gather, output blocks rearranged to rank order | (H-1) * S |

which is what crosses the network in NCCL's and the ForestColl bound's hierarchical schedules: each byte crosses
once per host pair on one rail, never once per GPU pair.

all_to_all, broadcast and ppermute have no such decomposition, and run as ONE network phase over the whole group
(its ranks in rank order, which are the communicator's ranks), as XLA runs them itself:

| collective | the network phase (NCCL on XLA's communicator) | bytes a rank sends across hosts |
|---|---|---|
| all_to_all | grouped ncclSend/ncclRecv of block p to and from every rank p | S/N for each rank on another host |
| broadcast | ncclBroadcast from the root | NCCL's ring or tree: S over each host boundary |
| ppermute | grouped ncclSend/ncclRecv of the pairs; a rank no pair targets writes zeros | S if its target is remote |

Why no host-local phase: in an all_to_all or a ppermute every byte has one source and one destination, so it
already crosses the network at most once, directly; an ipc phase could only gather a host's blocks onto fewer GPUs
before they leave (fewer, larger messages: an aggregation that helps small messages only, and sends from fewer
NICs), never move fewer bytes across hosts. A broadcast's ring or tree in NCCL already sends each byte across each
host boundary once and takes intra-host hops over NVLink/P2P, which is what an ipc phase would add. NCCL routes
the group's intra-host pairs over NVLink/P2P and its inter-host pairs over the NIC by itself, so the one phase
leaves the transport to it. These phases need no equal number of ranks per host.

Everything here is pure planning, used by the lowering (jaxcoll/lowering/host_phases.py) and tested without a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxcoll.algorithms.hierarchical import _layout
from jaxcoll.plan import Collective
from jaxcoll.plan.collectives import definition

IPC, NETWORK = "ipc", "network"

# The collectives that run across GPU hosts: the first three as host-local and rail phases, the rest as one
# network phase over the whole group.
RAILS = (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER)
WHOLE_GROUP = (Collective.ALL_TO_ALL, Collective.BROADCAST, Collective.PPERMUTE)
SUPPORTED = RAILS + WHOLE_GROUP


@dataclasses.dataclass(frozen=True)
class Phase:
    """One collective over sub-groups of the group's ranks: `groups[i]` lists the ranks of sub-group i in the order
    of their sub-ranks; `transport` is IPC (a jaxcoll plan within one host) or NETWORK (XLA's communicator).
    `root` (broadcast) and `pairs` (ppermute: (source, target) sub-ranks) are the collective's own parameters."""
    transport: str
    collective: Collective
    groups: tuple[tuple[int, ...], ...]
    root: int = 0
    pairs: tuple[tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A collective across hosts as phases. `input_blocks[i]`, when set, is the block of the rank's input that
    block i of the first phase's input holds; `output_blocks[i]`, when set, the block of the last phase's output
    that block i of the rank's output holds (both are local rearrangements, no data crosses ranks)."""
    collective: Collective
    hosts: tuple[tuple[int, ...], ...]  # the group's ranks on each host, rank order
    phases: tuple[Phase, ...]
    input_blocks: tuple[int, ...] | None = None
    output_blocks: tuple[int, ...] | None = None

    @property
    def rails(self) -> tuple[tuple[int, ...], ...]:
        """The network sub-groups: rail l is the l-th rank of every host, in host order."""
        return tuple(zip(*self.hosts))


def spans_hosts(host_of_rank: Sequence[int]) -> bool:
    return len(set(host_of_rank)) > 1


def schedule(collective, host_of_rank: Sequence[int], *, root: int = 0, perm=()) -> Schedule:
    """The phases of `collective` over a group whose rank r runs on host `host_of_rank[r]` (any labels; hosts are
    ordered by their first rank); `root` is a broadcast's root, `perm` a ppermute's (source, target) pairs, both
    in ranks of the group (checked by the collectives' argument checks before they get here). Raises ValueError,
    naming what is wrong, for a group on one host, a collective not built across hosts, or, for the collectives
    run on rails, hosts holding different numbers of the group's ranks."""
    collective = Collective(collective)
    hosts_of = tuple(int(h) for h in host_of_rank)
    if not spans_hosts(hosts_of):
        raise ValueError(f"the group's ranks are all on one host (host_of_rank={hosts_of}): no network phase")
    if collective not in SUPPORTED:
        raise ValueError(f"{collective.value} across GPU hosts is not built: jaxcoll runs "
                         f"{', '.join(c.value for c in SUPPORTED)} across hosts (docs/cuda.md); the group spans hosts "
                         f"{sorted(set(hosts_of))}")
    members, where, local = _layout(hosts_of)
    if collective in WHOLE_GROUP:
        # One network phase over the group in rank order: sub-rank = rank, so root and pairs carry over as they are.
        whole = (tuple(range(len(hosts_of))),)
        params = definition(collective).params
        pairs = tuple((int(s), int(t)) for s, t in perm) if "perm" in params else ()
        phase = Phase(NETWORK, collective, whole, root=int(root) if "root" in params else 0, pairs=pairs)
        return Schedule(collective, tuple(tuple(m) for m in members), (phase,))
    if len({len(m) for m in members}) != 1:
        raise ValueError(f"{collective.value} across GPU hosts needs the same number of the group's ranks on every "
                         f"host, got {[len(m) for m in members]} (host_of_rank={hosts_of})")
    nhosts, per = len(members), len(members[0])
    hosts = tuple(tuple(m) for m in members)
    rails = tuple(zip(*hosts))
    if collective is Collective.ALL_REDUCE:
        phases = (Phase(IPC, Collective.REDUCE_SCATTER, hosts), Phase(NETWORK, Collective.ALL_REDUCE, rails),
                  Phase(IPC, Collective.ALL_GATHER, hosts))
        return Schedule(collective, hosts, _drop_single(phases))
    if collective is Collective.REDUCE_SCATTER:
        # Sub-rank l of a host reduces, over the host, the blocks of the ranks on rail l (block h of its share is
        # host h's rank l's); the rail then reduces them over the hosts, leaving each rank its own block.
        order = tuple(hosts[h][l] for l in range(per) for h in range(nhosts))
        phases = (Phase(IPC, Collective.REDUCE_SCATTER, hosts), Phase(NETWORK, Collective.REDUCE_SCATTER, rails))
        return Schedule(collective, hosts, _drop_single(phases), input_blocks=order)
    # all_gather: the rail gathers the blocks of rank l of every host; the host then gathers its rails' results,
    # which leaves block (l, h) where rank order wants block hosts[h][l].
    order = tuple(local[r] * nhosts + where[r] for r in range(len(hosts_of)))
    phases = (Phase(NETWORK, Collective.ALL_GATHER, rails), Phase(IPC, Collective.ALL_GATHER, hosts))
    return Schedule(collective, hosts, _drop_single(phases), output_blocks=order)


def _drop_single(phases: tuple[Phase, ...]) -> tuple[Phase, ...]:
    """Phases over sub-groups of one rank are identities (one GPU per host): leave them out."""
    return tuple(p for p in phases if len(p.groups[0]) > 1)
