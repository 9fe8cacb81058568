"""jaxcoll.sim.gpu, the CUDA executor's cost model, against closed forms: a lane's steps add up, lanes run side by
side, a wait ends a signal's way after its signal, a barrier holds a rank's lanes for the last (a finished lane
counts as there), blocks per lane follow the executor's rule and its residency cap."""

from __future__ import annotations

import pytest

from jaxcoll.plan import Buffer, ChunkRef, Lane, Op, Plan, RankProgram, Step
from jaxcoll.plan.ir import Collective as C
from jaxcoll.sim import gpu

IN, OUT = Buffer.INPUT, Buffer.OUTPUT
MODEL = gpu.GpuModel(call_s=5e-6, step_s=2e-6, sync_s=0.5e-6, block_rate=10e9, device_rate=1e15, signal_s=3e-6)
ELEMENTS = 1 << 16  # 256 KiB of float32 a rank: bulk takes one block a lane
CHUNK_S = ELEMENTS * 4 / MODEL.block_rate  # one chunk (the whole buffer) through one block


def copy(rank: int, src: int = 0, dst: int = 0) -> Step:
    return Step(Op.COPY, (ChunkRef(rank, IN, src),), (ChunkRef(rank, OUT, dst),))


def plan_of(*ranks: tuple[Lane, ...], semaphores: int = 1) -> Plan:
    return Plan(C.CUSTOM, len(ranks), tuple(RankProgram(1, 1, 0, semaphores, lanes) for lanes in ranks))


def seconds(plan: Plan) -> float:
    return gpu.seconds(plan, ELEMENTS * 4, MODEL, "bulk")


def test_a_lanes_steps_add_up():
    plan = plan_of((Lane((copy(0), copy(0), copy(0))),))
    assert seconds(plan) == pytest.approx(MODEL.call_s + 3 * (MODEL.step_s + 2 * CHUNK_S))


def test_lanes_of_a_rank_run_side_by_side():
    plan = plan_of((Lane((copy(0), copy(0))), Lane((copy(0), copy(0)))))
    assert seconds(plan) == pytest.approx(MODEL.call_s + 2 * (MODEL.step_s + 2 * CHUNK_S))


def test_a_wait_ends_a_signals_way_after_its_signal():
    plan = plan_of((Lane((copy(0), Step(Op.SIGNAL, peer=1, sem=0))),),
                   (Lane((Step(Op.WAIT, sem=0), copy(1))),))
    data = MODEL.step_s + 2 * CHUNK_S
    assert seconds(plan) == pytest.approx(MODEL.call_s + data + MODEL.sync_s + MODEL.signal_s + MODEL.sync_s + data)


def test_a_wait_whose_signal_landed_long_ago_costs_a_sync_step():
    plan = plan_of((Lane((Step(Op.SIGNAL, peer=1, sem=0),)),),
                   (Lane((copy(1), copy(1), copy(1), Step(Op.WAIT, sem=0))),))
    assert seconds(plan) == pytest.approx(MODEL.call_s + 3 * (MODEL.step_s + 2 * CHUNK_S) + MODEL.sync_s)


def test_the_second_wait_needs_the_second_signal():
    signal, wait = Step(Op.SIGNAL, peer=1, sem=0), Step(Op.WAIT, sem=0)
    plan = plan_of((Lane((signal, copy(0), signal)),), (Lane((wait, wait)),))
    second = MODEL.sync_s + MODEL.step_s + 2 * CHUNK_S + MODEL.sync_s + MODEL.signal_s
    assert seconds(plan) == pytest.approx(MODEL.call_s + second + MODEL.sync_s)


def test_a_barrier_holds_the_ranks_lanes_for_the_last_and_a_finished_lane_counts_as_there():
    barrier = Step(Op.BARRIER)
    held = plan_of((Lane((copy(0), copy(0), copy(0), barrier, copy(0))), Lane((barrier, copy(0)))))
    data = MODEL.step_s + 2 * CHUNK_S
    assert seconds(held) == pytest.approx(MODEL.call_s + 3 * data + MODEL.sync_s + data)
    finished = plan_of((Lane((copy(0), barrier, copy(0))), Lane((copy(0),))))
    assert seconds(finished) == pytest.approx(MODEL.call_s + data + MODEL.sync_s + data)


def test_a_wait_no_signal_satisfies_is_an_error():
    plan = plan_of((Lane((Step(Op.WAIT, sem=0),)),))
    with pytest.raises(ValueError, match="lane 0 never finishes"):
        seconds(plan)


def test_the_device_rate_caps_every_lane_of_the_launch():
    model = gpu.GpuModel(call_s=0, step_s=0, sync_s=0, block_rate=10e9, device_rate=8e9, signal_s=0)
    plan = plan_of((Lane((copy(0),)), Lane((copy(0),))))  # two lanes share 8 GB/s: 4 GB/s each
    assert gpu.seconds(plan, ELEMENTS * 4, model, "bulk") == pytest.approx(2 * ELEMENTS * 4 / 4e9)


@pytest.mark.parametrize("protocol, elements, lanes, ranks, resident, want", [
    ("ll", 2048, 1, 8, 264, 4),          # 8 KiB of float32: a block per 512 elements
    ("ll", 16384, 1, 8, 264, 16),        # 64 KiB: capped at 16 on packets
    ("ll", 16384, 4, 8, 264, 8),         # 4 lanes: 4096 elements a lane, 8 blocks
    ("ll", 1, 1, 8, 264, 1),
    ("bulk", 64 << 20, 1, 8, 264, 32),   # 256 MiB: one a MiB, capped at 32
    ("bulk", 64 << 20, 4, 8, 264, 8),    # 4 lanes x 8 ranks: 264 // 32 resident a lane
    ("bulk", 1 << 10, 1, 8, 264, 1),
])
def test_blocks_per_lane_follow_the_executors_rule(protocol, elements, lanes, ranks, resident, want):
    plan = plan_of(*[tuple(Lane((copy(r),)) for _ in range(lanes)) for r in range(ranks)])
    assert gpu.blocks_per_lane(plan, elements, elements, 4, protocol, ranks, resident) == want


def test_a_launch_that_cannot_hold_a_block_a_lane_is_refused_naming_the_counts():
    plan = plan_of(*[tuple(Lane((copy(r),)) for _ in range(40)) for r in range(8)])
    with pytest.raises(ValueError, match="8 ranks x 40 lanes need more blocks resident than the device's 264"):
        gpu.blocks_per_lane(plan, 1024, 1024, 4, "bulk", 8, 264)
    with pytest.raises(ValueError, match="protocol must be 'll' or 'bulk', got 'simple'"):
        gpu.blocks_per_lane(plan, 1024, 1024, 4, "simple", 1, 264)
