"""The CUDA executor, driven through the emulated-rank harness: every rank of a group on ONE GPU, one launch
holding all ranks' thread blocks, peers through ordinary device pointers. Every built-in plan, language-written
and synthesized plans run for N = 2..8, every dtype and reduction, both protocols, against numpy.

Tests that need a GPU skip with the reason when jaxcoll was built without CUDA or no CUDA device is usable;
the plan-layout tests need only a CUDA build."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jaxcoll import algorithms, runtime
from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step, encode
from jaxcoll.plan import abi
from jaxcoll.plan.ir import Collective as C
from test_lang_plans import example_plans

IN, OUT, SCR = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
TIMEOUT_S = 30.0

_usable, _why = runtime.cuda_status()
needs_gpu = pytest.mark.skipif(not _usable, reason=_why or "CUDA executor usable")
needs_cuda_build = pytest.mark.skipif(not getattr(runtime._jaxcoll, "with_cuda", False),
                                      reason="jaxcoll was built without the CUDA executor")

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint32,
          np.bool_]
OPS = ["sum", "max", "min"]
PROTOCOLS = ["ll", "bulk"]
REDUCING = {C.ALL_REDUCE, C.REDUCE_SCATTER}


# ---------------------------------------------------------------------------------------------------------------
# References (numpy): the collective's definition, with sums that are exact in every reduction order
# ---------------------------------------------------------------------------------------------------------------
def inputs_for(n: int, elements: int, dtype, seed: int = 0) -> list[np.ndarray]:
    """Floats are small integers, so every partial sum is exact in float16/bfloat16 and the order in which a
    plan reduces cannot change the result; integers span their whole range (sums wrap)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return [rng.random(elements) < 0.5 for _ in range(n)]
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return [rng.integers(info.min, info.max, elements, dtype=dtype, endpoint=True) for _ in range(n)]
    return [rng.integers(-8, 9, elements).astype(dtype) for _ in range(n)]


def reduce_ranks(xs: list[np.ndarray], op: str) -> np.ndarray:
    stack = np.stack(xs)
    if stack.dtype == np.bool_:
        return np.logical_and.reduce(stack) if op == "min" else np.logical_or.reduce(stack)
    if op == "sum":
        if np.issubdtype(stack.dtype, np.integer):
            return np.add.reduce(stack, axis=0, dtype=stack.dtype)  # wraps, as the executor does
        return np.add.reduce(stack.astype(np.float64), axis=0).astype(stack.dtype)
    return (np.maximum if op == "max" else np.minimum).reduce(stack, axis=0)


def expected(plan: Plan, xs: list[np.ndarray], op: str) -> list[np.ndarray]:
    n = plan.nranks
    c = plan.collective
    if c is C.ALL_REDUCE:
        return [reduce_ranks(xs, op)] * n
    if c is C.ALL_GATHER:
        return [np.concatenate(xs)] * n
    if c is C.REDUCE_SCATTER:
        return list(np.split(reduce_ranks(xs, op), n))
    if c is C.ALL_TO_ALL:
        blocks = [np.split(x, n) for x in xs]
        return [np.concatenate([blocks[p][r] for p in range(n)]) for r in range(n)]
    if c is C.BROADCAST:
        return [xs[plan.root]] * n
    if c is C.PPERMUTE:
        out = [np.zeros_like(xs[0]) for _ in range(n)]
        for src, dst in plan.perm:
            out[dst] = xs[src]
        return out
    raise AssertionError(f"no reference for {c}")


def run_and_compare(plan: Plan, elements: int, dtype, op: str = "sum", protocol: str = "auto", calls: int = 1,
                    blocks_per_lane: int = 0, seed: int = 0) -> dict:
    xs = inputs_for(plan.nranks, elements, dtype, seed)
    outs, info = runtime.run_words_cuda(encode(plan), xs, runtime.output_shape(plan, xs[0].shape),
                                        abi.REDUCE_OP_CODES[op], TIMEOUT_S, protocol, blocks_per_lane, calls)
    for r, (got, want) in enumerate(zip(outs, expected(plan, xs, op))):
        np.testing.assert_array_equal(got, want, err_msg=f"rank {r} of {plan.name or plan.collective.value} "
                                                         f"({np.dtype(dtype).name}, {op}, {info})")
    return info


def builtin_plans():
    """(id, plan) for every built-in algorithm of every collective, N = 2..8."""
    out = []
    for collective, names in algorithms.BUILTINS.items():
        for name in names:
            for n in range(2, 9):
                if collective is C.BROADCAST:
                    plan = algorithms.builtin(collective, name, n, root=n // 2)
                elif collective is C.PPERMUTE:
                    plan = algorithms.builtin(collective, name, n, perm=tuple((r, (r + 1) % n) for r in range(n - 1)))
                else:
                    plan = algorithms.builtin(collective, name, n)
                out.append((f"{collective.value}-{name}-{n}", plan))
    return out


BUILTIN = builtin_plans()


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
    ops = OPS if plan.collective in REDUCING else ["sum"]
    for dtype in DTYPES:
        for op in ops:
            # 37 elements per block: uneven chunks, unaligned vectors, scalar tails.
            run_and_compare(plan, plan.in_blocks * 37, dtype, op, protocol)


@needs_gpu
@pytest.mark.parametrize("elements", [1, 8, 4096, (1 << 20) + 3])
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("algorithm", ["direct", "two_shot", "ring"])
def test_all_reduce_sizes_from_one_element_to_a_mebibyte(algorithm, protocol, elements):
    plan = algorithms.builtin(C.ALL_REDUCE, algorithm, 8)
    run_and_compare(plan, elements, np.float32, "sum", protocol)
    run_and_compare(plan, elements, ml_dtypes.bfloat16, "max", protocol)


@needs_gpu
@pytest.mark.parametrize("blocks", [1, 2, 3, 7])
@pytest.mark.parametrize("algorithm", ["two_shot", "ring"])
def test_many_blocks_per_lane_split_every_step(algorithm, blocks):
    plan = algorithms.builtin(C.ALL_REDUCE, algorithm, 4)
    info = run_and_compare(plan, 4 * 100_003, np.float32, "sum", "bulk", blocks_per_lane=blocks)
    assert info["blocks_per_lane"] == blocks


@needs_gpu
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_repeated_calls_advance_the_monotonic_semaphores(protocol):
    """Ring plans signal and wait every call; semaphores and packet flags are never reset, so calls 2..5 only
    work if every threshold accounts for the calls before."""
    plan = algorithms.builtin(C.ALL_REDUCE, "ring", 5)
    run_and_compare(plan, 5 * 1000, np.int32, "sum", protocol, calls=5)


@needs_gpu
@pytest.mark.parametrize("name,plan", example_plans(), ids=[i for i, _ in example_plans()])
def test_language_plans_match_numpy(name, plan):
    if plan.collective not in (C.ALL_REDUCE, C.ALL_GATHER, C.REDUCE_SCATTER, C.ALL_TO_ALL):
        pytest.skip(f"{name} is a custom collective with no numpy reference here")
    for protocol in ("auto", "bulk"):
        run_and_compare(plan, plan.in_blocks * 37, np.float32, "sum", protocol)
        run_and_compare(plan, plan.in_blocks * 1000, ml_dtypes.bfloat16, "sum", protocol)


@needs_gpu
@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("nbytes", [1 << 12, 1 << 24])
def test_synthesized_plans_match_numpy(collective, nbytes):
    from jaxcoll.synth import synthesize
    from jaxcoll.topology import preset
    plan = synthesize(preset("dgx-h100"), collective, nbytes)
    run_and_compare(plan, plan.in_blocks * 257, np.float32, "sum")
    run_and_compare(plan, plan.in_blocks * 257, np.float16, "max")


@needs_gpu
def test_in_place_plans_are_staged():
    n = 4
    ranks = []
    for r in range(n):
        step = Step(Op.READ_REDUCE, tuple(ChunkRef(p, IN, r) for p in range(n)), tuple(ChunkRef(p, OUT, r) for p in range(n)))
        ranks.append(RankProgram(n, n, 0, 0, (Lane((step,)),)))
    plan = Plan(C.ALL_REDUCE, n, tuple(ranks), in_place=True)
    run_and_compare(plan, 999, np.float32, "sum")


@needs_gpu
def test_a_wait_that_is_never_signalled_times_out_naming_the_semaphore():
    steps0 = (Step(Op.WAIT, sem=0), Step(Op.COPY, (ChunkRef(0, IN, 0),), (ChunkRef(0, OUT, 0),)))
    steps1 = (Step(Op.COPY, (ChunkRef(1, IN, 0),), (ChunkRef(1, OUT, 0),)),)
    plan = Plan(C.CUSTOM, 2, (RankProgram(1, 1, 0, 1, (Lane(steps0),)), RankProgram(1, 1, 0, 0, (Lane(steps1),))))
    with pytest.raises(RuntimeError) as info:
        runtime.run_words_cuda(encode(plan), [np.ones(4, np.float32)] * 2, (4,), timeout_s=0.5, protocol="bulk")
    message = str(info.value)
    assert "rank 0, lane 0, step 0 (wait)" in message and "semaphore 0" in message
    assert "JAXCOLL_TIMEOUT" in message
