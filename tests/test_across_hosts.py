"""Collectives across GPU hosts as phases (jaxcoll.algorithms.across_hosts): which phases run on the host's GPUs
(jaxcoll plans over CUDA IPC) and which on the network (XLA's communicator), and that the phases compute the
collective. The phases are run here by a numpy model of each sub-collective, and the result compared with the
collective computed directly in numpy; no GPU is needed (the custom calls themselves run only on GPU hosts)."""

import numpy as np
import pytest

from jaxcoll.algorithms import across_hosts
from jaxcoll.algorithms.across_hosts import IPC, NETWORK
from jaxcoll.plan import Collective

AR, RS, AG = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER
A2A, BC, PP = Collective.ALL_TO_ALL, Collective.BROADCAST, Collective.PPERMUTE


def run_phases(schedule, inputs):
    """Each phase's sub-collectives in numpy, over the sub-groups it names, in sub-rank order."""
    data = [np.asarray(x, np.float64) for x in inputs]

    def rearrange(order):
        for r, x in enumerate(data):
            blocks = np.split(x, len(order))
            data[r] = np.concatenate([blocks[i] for i in order])

    if schedule.input_blocks is not None:
        rearrange(schedule.input_blocks)
    for phase in schedule.phases:
        for members in phase.groups:
            xs = [data[r] for r in members]
            n = len(xs)
            if phase.collective is AR:
                outs = [sum(xs)] * n
            elif phase.collective is RS:
                outs = list(np.split(sum(xs), n))
            elif phase.collective is AG:
                outs = [np.concatenate(xs)] * n
            elif phase.collective is A2A:  # what grouped ncclSend/ncclRecv of block p to and from sub-rank p do
                outs = [np.concatenate([np.split(xs[p], n)[q] for p in range(n)]) for q in range(n)]
            elif phase.collective is BC:  # ncclBroadcast from sub-rank root
                outs = [xs[phase.root]] * n
            else:  # ppermute: a send/recv per pair; a sub-rank no pair targets writes zeros
                outs = [np.zeros_like(x) for x in xs]
                for source, target in phase.pairs:
                    outs[target] = xs[source]
            for r, out in zip(members, outs):
                data[r] = out
    if schedule.output_blocks is not None:
        rearrange(schedule.output_blocks)
    return data


LAYOUTS = {
    "2 hosts x 2, host-major": (0, 0, 1, 1),
    "2 hosts x 2, interleaved": (0, 1, 0, 1),
    "2 hosts x 4": (0, 0, 0, 0, 1, 1, 1, 1),
    "3 hosts x 2, shuffled": (2, 0, 1, 1, 0, 2),
    "4 hosts x 1": (0, 1, 2, 3),
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("collective", [AR, RS, AG])
def test_the_phases_compute_the_collective(collective, layout):
    n = len(layout)
    rng = np.random.default_rng(n)
    block = 3
    inputs = [rng.integers(-50, 50, size=(n * block if collective is not AG else block,)) for _ in range(n)]
    schedule = across_hosts.schedule(collective, layout)
    got = run_phases(schedule, inputs)
    total = np.sum(inputs, axis=0)
    for r in range(n):
        want = {AR: total, RS: total[r * block:(r + 1) * block], AG: np.concatenate(inputs)}[collective]
        np.testing.assert_array_equal(got[r], want)


def test_all_reduce_is_ipc_then_network_over_rails_then_ipc():
    # 2 hosts x 2 GPUs: within each host first, then the rails (one GPU per host) across, then within again.
    s = across_hosts.schedule(AR, (0, 0, 1, 1))
    assert [(p.transport, p.collective) for p in s.phases] == [(IPC, RS), (NETWORK, AR), (IPC, AG)]
    assert s.phases[0].groups == ((0, 1), (2, 3))   # each host's GPUs: CUDA IPC / peer memory
    assert s.phases[1].groups == ((0, 2), (1, 3))   # each rail: rank l of every host, over the network
    assert s.rails == ((0, 2), (1, 3))


def test_rails_follow_the_ranks_positions_on_their_hosts_whatever_the_rank_order():
    s = across_hosts.schedule(RS, (0, 1, 0, 1))
    assert s.hosts == ((0, 2), (1, 3))
    assert [(p.transport, p.groups) for p in s.phases] == [(IPC, ((0, 2), (1, 3))), (NETWORK, ((0, 1), (2, 3)))]
    # sub-rank l of a host reduces the blocks of rail l's ranks, host by host
    assert s.input_blocks == (0, 1, 2, 3)


def test_one_gpu_per_host_leaves_only_the_network_phase():
    for collective in (AR, RS, AG):
        s = across_hosts.schedule(collective, (0, 1, 2))
        assert [p.transport for p in s.phases] == [NETWORK]


def test_all_gather_crosses_the_network_first_and_puts_blocks_back_in_rank_order():
    s = across_hosts.schedule(AG, (0, 0, 1, 1))
    assert [(p.transport, p.collective) for p in s.phases] == [(NETWORK, AG), (IPC, AG)]
    # after the phases block (l, h) holds rank hosts[h][l]'s input
    assert s.output_blocks == (0, 2, 1, 3)


UNEVEN = {**LAYOUTS, "3 + 1 ranks": (0, 0, 0, 1), "1 + 2 + 3, interleaved": (2, 1, 2, 0, 1, 2)}


def _reference(collective, inputs, root, perm):
    n = len(inputs)
    if collective is A2A:  # lax.all_to_all, tiled, split and concat along the one axis
        return [np.concatenate([np.split(inputs[p], n)[q] for p in range(n)]) for q in range(n)]
    if collective is BC:
        return [inputs[root]] * n
    out = [np.zeros_like(x) for x in inputs]
    for source, target in perm:
        out[target] = inputs[source]
    return out


@pytest.mark.parametrize("layout", UNEVEN.values(), ids=UNEVEN.keys())
@pytest.mark.parametrize("collective", [A2A, BC, PP])
def test_the_whole_group_phase_computes_the_collective_on_any_host_layout(collective, layout):
    n = len(layout)
    rng = np.random.default_rng(n)
    inputs = [rng.integers(-50, 50, size=(n * 2,)) for _ in range(n)]
    root = n - 1
    # A shift that skips rank 0 as a target (it gets zeros), and one rank sending to itself.
    perm = tuple((r, r + 1) for r in range(n - 1)) + ((n - 1, n - 1),) if n > 2 else ((0, 1),)
    schedule = across_hosts.schedule(collective, layout, root=root, perm=perm)
    got = run_phases(schedule, inputs)
    for r, want in enumerate(_reference(collective, inputs, root, perm)):
        np.testing.assert_array_equal(got[r], want, err_msg=f"rank {r}")


@pytest.mark.parametrize("collective", [A2A, BC, PP])
def test_collectives_without_a_rail_decomposition_are_one_network_phase_over_the_group(collective):
    s = across_hosts.schedule(collective, (0, 1, 0, 1, 1), root=3, perm=((0, 4), (4, 0)))
    phase, = s.phases
    assert (phase.transport, phase.collective, phase.groups) == (NETWORK, collective, ((0, 1, 2, 3, 4),))
    assert phase.root == (3 if collective is BC else 0)
    assert phase.pairs == (((0, 4), (4, 0)) if collective is PP else ())
    assert s.hosts == ((0, 2), (1, 3, 4))  # hosts need not hold equal numbers of the group's ranks


def test_a_collective_not_built_across_hosts_is_refused_by_name():
    with pytest.raises(ValueError, match=r"custom across GPU hosts is not built: jaxcoll runs all_reduce, "
                                         r"reduce_scatter, all_gather, all_to_all, broadcast, ppermute"):
        across_hosts.schedule(Collective.CUSTOM, (0, 0, 1, 1))


def test_hosts_with_different_numbers_of_ranks_are_refused_naming_the_counts():
    with pytest.raises(ValueError, match=r"same number of the group's ranks on every host, got \[3, 1\]"):
        across_hosts.schedule(AR, (0, 0, 0, 1))


def test_a_group_on_one_host_has_no_network_phase_and_is_refused():
    assert not across_hosts.spans_hosts((0, 0, 0))
    with pytest.raises(ValueError, match="all on one host"):
        across_hosts.schedule(AR, (5, 5))
