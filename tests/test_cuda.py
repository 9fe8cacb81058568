"""The CUDA executor, driven through the emulated-rank harness: every rank of a group on ONE GPU, one launch
holding all ranks' thread blocks, peers through ordinary device pointers. Built-in plans (N = 2..8), every plan
the synthesizer weighs on the 8-rank presets, and language-written plans run with every dtype and reduction, both
protocols, sizes from one element to 256 MiB per rank (the 256 MiB cases marked `large`), odd sizes and buffers at
misaligned offsets, against numpy. The cases and references are tests/cuda_cases.py, checked on the CPU executor
by test_cuda_cases.py.

Tests that need a GPU skip with the reason when jaxcoll was built without CUDA or no CUDA device is usable;
the plan-layout tests need only a CUDA build."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cuda_cases as cases
from cuda_cases import DTYPES, PROTOCOLS
from jaxcoll import algorithms, runtime
from jaxcoll.plan import Buffer, ChunkRef, Lane, Op, Plan, RankProgram, Step, encode
from jaxcoll.plan.ir import Collective as C
from jaxcoll.sim import gpu

IN, OUT, SCR = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
TIMEOUT_S = 30.0

_usable, _why = runtime.cuda_status()
needs_gpu = pytest.mark.skipif(not _usable, reason=_why or "CUDA executor usable")
needs_cuda_build = pytest.mark.skipif(not getattr(runtime._jaxcoll, "with_cuda", False),
                                      reason="jaxcoll was built without the CUDA executor")
# The 256 MiB cases: the GPU round runs them as a step of their own (`-m large`), with its own time limit.
large = pytest.mark.large

BUILTIN = cases.builtin_plans()


def run_and_compare(plan: Plan, elements: int, dtype, op: str = "sum", protocol: str = "auto", **kw) -> dict:
    return cases.run_and_compare(runtime.run_words_cuda, plan, elements, dtype, op, protocol, timeout_s=TIMEOUT_S,
                                 **kw)


# ---------------------------------------------------------------------------------------------------------------
# Plan layout (a CUDA build, no GPU)
# ---------------------------------------------------------------------------------------------------------------
@needs_cuda_build
@pytest.mark.parametrize("name,plan", BUILTIN, ids=[i for i, _ in BUILTIN])
def test_every_builtin_plan_can_use_the_packet_protocol(name, plan):
    info = runtime._jaxcoll.cuda_plan_info(encode(plan))
    assert info["ll_ok"], info["ll_reason"]


@needs_cuda_build
def test_a_chunk_written_twice_by_peers_keeps_a_plan_on_the_bulk_protocol():
    # Rank 1 writes rank 0's output chunk, then rank 0 overwrites it: packets could not tell the writes apart.
    steps0 = (Step(Op.WAIT, sem=0), Step(Op.COPY, (ChunkRef(0, IN, 0),), (ChunkRef(0, OUT, 0),)))
    steps1 = (Step(Op.PUT, (ChunkRef(1, IN, 0),), (ChunkRef(0, OUT, 0), ChunkRef(1, OUT, 0))),
              Step(Op.SIGNAL, peer=0, sem=0))
    plan = Plan(C.CUSTOM, 2, (RankProgram(1, 1, 0, 1, (Lane(steps0),)), RankProgram(1, 1, 0, 0, (Lane(steps1),))))
    info = runtime._jaxcoll.cuda_plan_info(encode(plan))
    assert not info["ll_ok"] and "written 2 times" in info["ll_reason"]


@needs_cuda_build
def test_steps_on_overlapping_chunk_ranges_make_a_lane_meet():
    # Step 2 reads chunks 0..1 that step 1 wrote one at a time: a lane's blocks split them differently.
    lane = (Step(Op.COPY, (ChunkRef(0, IN, 0),), (ChunkRef(0, SCR, 0),)),
            Step(Op.COPY, (ChunkRef(0, IN, 1),), (ChunkRef(0, SCR, 1),)),
            Step(Op.COPY, (ChunkRef(0, SCR, 0, 2),), (ChunkRef(0, OUT, 0, 2),)))
    plan = Plan(C.CUSTOM, 1, (RankProgram(2, 2, 2, 0, (Lane(lane),)),))
    assert runtime._jaxcoll.cuda_plan_info(encode(plan))["lane_meetings"] == 1


@needs_cuda_build
@pytest.mark.parametrize("collective, algorithm, nranks, nbytes", [
    (C.ALL_REDUCE, "direct", 8, 8 << 10), (C.ALL_REDUCE, "direct", 2, 8 << 10), (C.ALL_REDUCE, "direct", 8, 64 << 10),
    (C.ALL_REDUCE, "direct", 8, 4), (C.ALL_GATHER, "direct", 8, 8 << 10), (C.REDUCE_SCATTER, "direct", 8, 8 << 10),
    (C.ALL_REDUCE, "ring", 8, 8 << 10), (C.ALL_REDUCE, "two_shot", 4, 256 << 20)])
def test_blocks_per_lane_follow_the_larger_buffer_on_packets_and_the_input_on_bulk(collective, algorithm, nranks,
                                                                                  nbytes):
    plan = algorithms.builtin(collective, algorithm, nranks)
    ins, outs = plan.elements_for_bytes(nbytes, 4)
    info = runtime._jaxcoll.cuda_plan_info(encode(plan), ins, outs, "float32")
    lanes = info["max_lanes"]
    # Packets: one 512-thread block per 512 elements of a lane's larger buffer, 1..16; bulk: one per MiB of a
    # lane's input, 1..32.
    assert info["blocks_per_lane"]["ll"] == min(16, max(1, -(-max(ins, outs) // lanes // 512)))
    assert info["blocks_per_lane"]["bulk"] == min(32, max(1, -(-(ins * 4 // lanes) // (1 << 20))))
    # The GPU cost model's twin of the rule (before the residency cap) agrees.
    for protocol in ("ll", "bulk"):
        assert gpu.blocks_per_lane(plan, ins, outs, 4, protocol, 1, 1 << 20) == info["blocks_per_lane"][protocol]


def test_cuda_status_gives_a_reason_when_unusable():
    usable, why = runtime.cuda_status()
    assert usable or why


# ---------------------------------------------------------------------------------------------------------------
# Plans on the GPU
# ---------------------------------------------------------------------------------------------------------------
@needs_gpu
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name,plan", BUILTIN, ids=[i for i, _ in BUILTIN])
def test_builtin_plans_match_numpy_for_every_dtype_and_op(name, plan, protocol):
    for dtype in DTYPES:
        for op in cases.ops_for(plan):
            # 37 elements per block: uneven chunks, unaligned vectors, scalar tails.
            run_and_compare(plan, plan.in_blocks * 37, dtype, op, protocol)


ODD = cases.builtin_plans(sizes=(3, 8))


@needs_gpu
@pytest.mark.parametrize("block", cases.ODD_BLOCK_ELEMENTS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name,plan", ODD, ids=[i for i, _ in ODD])
def test_builtin_plans_at_sizes_from_one_element_to_a_mebibyte(name, plan, protocol, block):
    elements = plan.in_blocks * block
    run_and_compare(plan, elements, np.float32, "sum", protocol)
    run_and_compare(plan, elements, ml_dtypes.bfloat16, cases.ops_for(plan)[-1], protocol)  # min where it reduces
    run_and_compare(plan, elements, np.float16, "sum", protocol, seed=1)


MISALIGNED_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8]
FIVE = cases.builtin_plans(sizes=(5,))


@needs_gpu
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name,plan", FIVE, ids=[i for i, _ in FIVE])
def test_buffers_at_misaligned_offsets_match_numpy(name, plan, protocol):
    """Every rank's input and output start a different number of elements past a 16-byte boundary: no one peel
    aligns them all, so steps between ranks take the kernel's element-by-element path."""
    for i, dtype in enumerate(MISALIGNED_DTYPES):
        offsets = cases.misaligned_offsets(plan.nranks, dtype, seed=i)
        for block in (1, 1001):
            run_and_compare(plan, plan.in_blocks * block, dtype, cases.ops_for(plan)[0], protocol, offsets=offsets)


@needs_gpu
@pytest.mark.parametrize("blocks", [1, 2, 3, 7])
@pytest.mark.parametrize("algorithm", ["two_shot", "ring"])
def test_many_blocks_per_lane_split_every_step(algorithm, blocks):
    plan = algorithms.builtin(C.ALL_REDUCE, algorithm, 4)
    for offsets in (None, cases.misaligned_offsets(4, np.float32)):  # each block's share: vectors, then elements
        info = run_and_compare(plan, 4 * 100_003, np.float32, "sum", "bulk", blocks_per_lane=blocks, offsets=offsets)
        assert info["blocks_per_lane"] == blocks


@needs_gpu
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_repeated_calls_advance_the_monotonic_semaphores(protocol):
    """Ring plans signal and wait every call; semaphores and packet flags are never reset, so calls 2..5 only
    work if every threshold accounts for the calls before."""
    plan = algorithms.builtin(C.ALL_REDUCE, "ring", 5)
    run_and_compare(plan, 5 * 1000, np.int32, "sum", protocol, calls=5)


LANGUAGE = cases.language_plans()


@needs_gpu
@pytest.mark.parametrize("name,plan", LANGUAGE, ids=[i for i, _ in LANGUAGE])
def test_language_plans_match_numpy(name, plan):
    for protocol in ("auto", "bulk"):
        run_and_compare(plan, plan.in_blocks * 37, np.float32, "sum", protocol)
        run_and_compare(plan, plan.in_blocks * 1000, ml_dtypes.bfloat16, "sum", protocol)
        run_and_compare(plan, plan.in_blocks * 1000, np.float16, "max", protocol)


SYNTHESIZED = cases.synthesized_cases()


@needs_gpu
@pytest.mark.parametrize("preset,collective,candidate", SYNTHESIZED, ids=["-".join(c) for c in SYNTHESIZED])
def test_synthesized_plans_of_the_8_rank_presets_match_numpy(preset, collective, candidate):
    """Every plan the synthesizer weighs on each 8-rank preset (rings, trees, forests, direct...), so a plan it
    picks at any size has run."""
    plan = cases.synthesized_plan(preset, collective, candidate)
    for protocol in ("auto", "bulk"):
        run_and_compare(plan, plan.in_blocks * 257, np.float32, "sum", protocol)
        run_and_compare(plan, plan.in_blocks * 257, np.float16, "max", protocol)
        run_and_compare(plan, plan.in_blocks * 4099, ml_dtypes.bfloat16, "sum", protocol)


# The 256 MiB cases: (collective, algorithm, protocol, dtype, op). all_reduce and all_to_all move 256 MiB in and
# out per rank, all_gather gathers 256 MiB (32 MiB in at 8 ranks), reduce_scatter reduces 256 MiB.
LARGE = [(C.ALL_REDUCE, "ring", "bulk", np.float32, "sum"), (C.ALL_REDUCE, "two_shot", "bulk", np.float32, "sum"),
         (C.ALL_REDUCE, "direct", "bulk", ml_dtypes.bfloat16, "max"), (C.ALL_REDUCE, "direct", "ll", np.float32, "sum"),
         (C.ALL_GATHER, "direct", "bulk", np.float32, "sum"), (C.ALL_GATHER, "ring", "bulk", np.float16, "sum"),
         (C.REDUCE_SCATTER, "ring", "bulk", np.float32, "sum"), (C.ALL_TO_ALL, "direct", "bulk", np.int32, "sum")]


@needs_gpu
@large
@pytest.mark.parametrize("collective,algorithm,protocol,dtype,op", LARGE,
                         ids=[f"{c.value}-{a}-{p}-{np.dtype(d).name}" for c, a, p, d, _ in LARGE])
def test_256_mib_per_rank_at_8_ranks_matches_numpy(collective, algorithm, protocol, dtype, op):
    plan = algorithms.builtin(collective, algorithm, 8)
    elements = cases.elements_for_bytes(plan, cases.LARGE_BYTES, dtype)
    info = run_and_compare(plan, elements, dtype, op, protocol)
    assert info["protocol"] == protocol


@needs_gpu
@large
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_odd_size_near_256_mib_at_misaligned_offsets_matches_numpy(protocol):
    plan = algorithms.builtin(C.ALL_REDUCE, "ring", 8)
    elements = cases.elements_for_bytes(plan, cases.LARGE_BYTES, np.float32) - 5
    run_and_compare(plan, elements, np.float32, "sum", protocol, offsets=cases.misaligned_offsets(8, np.float32))


DRIFT = [(C.ALL_REDUCE, "ring"), (C.ALL_GATHER, "ring"), (C.REDUCE_SCATTER, "ring"), (C.ALL_REDUCE, "two_shot")]


@needs_gpu
@pytest.mark.parametrize("collective,algorithm", DRIFT, ids=[f"{c.value}-{a}" for c, a in DRIFT])
def test_blocks_of_a_lane_that_drift_apart_never_read_a_share_not_yet_written(collective, algorithm):
    """32 blocks per lane on the element-by-element path (misaligned buffers), the slowest: a lane's blocks run
    steps apart, and a wait must hold until every block of the signalling lane wrote its share of that step, not
    until the lane's blocks together sent enough signals (the first GPU round's 256 MiB ring failure)."""
    plan = algorithms.builtin(collective, algorithm, 8)
    elements = cases.elements_for_bytes(plan, 16 << 20, np.float32) - plan.in_blocks * 3
    info = run_and_compare(plan, elements, np.float32, "sum", "bulk", blocks_per_lane=32, calls=3,
                           offsets=cases.misaligned_offsets(8, np.float32, seed=1))
    assert info["blocks_per_lane"] == 32


def test_more_blocks_per_lane_than_a_semaphore_counts_are_refused_naming_the_argument():
    plan = algorithms.builtin(C.ALL_REDUCE, "ring", 2)
    for bad in (33, -1, 2.0, True):
        with pytest.raises(ValueError, match=rf"blocks_per_lane must be 0 .* or 1\.\.32, got {bad!r}"):
            runtime.run_words_cuda(encode(plan), [np.ones(4, np.float32)] * 2, (4,), blocks_per_lane=bad)


def in_place_all_reduce(n: int) -> Plan:
    ranks = []
    for r in range(n):
        step = Step(Op.READ_REDUCE, tuple(ChunkRef(p, IN, r) for p in range(n)), tuple(ChunkRef(p, OUT, r) for p in range(n)))
        ranks.append(RankProgram(n, n, 0, 0, (Lane((step,)),)))
    return Plan(C.ALL_REDUCE, n, tuple(ranks), in_place=True)


@needs_gpu
def test_in_place_plans_are_staged():
    run_and_compare(in_place_all_reduce(4), 999, np.float32, "sum")


@needs_gpu
@pytest.mark.parametrize("name,plan", FIVE, ids=[i for i, _ in FIVE])
def test_plans_staged_in_their_slots_as_across_processes_match_numpy(name, plan):
    """The bulk protocol of a group spanning processes: each rank's buffers are copied into its slot around the
    kernel and peers reach them by offsets from the slot (another process cannot address XLA's buffers)."""
    for dtype in (np.float32, ml_dtypes.bfloat16, np.int8):
        info = run_and_compare(plan, plan.in_blocks * 1001, dtype, cases.ops_for(plan)[-1], "bulk", staged=True,
                               calls=2, offsets=cases.misaligned_offsets(plan.nranks, dtype))
        assert info["protocol"] == "bulk"


@needs_gpu
def test_in_place_plans_staged_in_their_slots_match_numpy():
    run_and_compare(in_place_all_reduce(4), 999, np.float32, "sum", "bulk", staged=True, calls=2)


def never_signalled_plan() -> Plan:
    """Rank 0 waits on a semaphore that no rank signals: the peer that never arrives."""
    steps0 = (Step(Op.WAIT, sem=0), Step(Op.COPY, (ChunkRef(0, IN, 0),), (ChunkRef(0, OUT, 0),)))
    steps1 = (Step(Op.COPY, (ChunkRef(1, IN, 0),), (ChunkRef(1, OUT, 0),)),)
    return Plan(C.CUSTOM, 2, (RankProgram(1, 1, 0, 1, (Lane(steps0),)), RankProgram(1, 1, 0, 0, (Lane(steps1),))))


@needs_gpu
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_wait_that_is_never_signalled_times_out_naming_the_semaphore(protocol):
    with pytest.raises(RuntimeError) as info:
        runtime.run_words_cuda(encode(never_signalled_plan()), [np.ones(4, np.float32)] * 2, (4,), timeout_s=0.5,
                               protocol=protocol)
    message = str(info.value)
    assert "rank 0, lane 0, step 0 (wait)" in message and "semaphore 0" in message
    assert "JAXCOLL_TIMEOUT" in message


def test_bad_offsets_are_refused_naming_the_argument():
    plan = algorithms.builtin(C.ALL_REDUCE, "ring", 2)
    for bad in ([0], [0, -1], [0, 1.5]):
        with pytest.raises(ValueError, match=r"input_offsets must be one whole number >= 0 per rank \(2\)"):
            runtime.run_words_cuda(encode(plan), [np.ones(4, np.float32)] * 2, (4,), input_offsets=bad)
