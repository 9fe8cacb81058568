"""The GPU harness's cases (tests/cuda_cases.py) without a GPU: the plans it selects, the sizes and offsets it
generates, and its numpy references, run through the CPU executor. A case or reference that is wrong fails
here, so a failure in the GPU round points at the CUDA executor."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cuda_cases as cases
from jaxcoll import algorithms
from jaxcoll.plan.ir import Collective as C


AT_2_AND_8 = cases.builtin_plans(sizes=(2, 8))
AT_3_AND_8 = cases.builtin_plans(sizes=(3, 8))
AT_5 = cases.builtin_plans(sizes=(5,))


def run(plan, elements, dtype, op="sum", **kw):
    return cases.run_and_compare(cases.run_cpu, plan, elements, dtype, op, **kw)


# ---------------------------------------------------------------------------------------------------------------
# References against closed forms
# ---------------------------------------------------------------------------------------------------------------
def test_integer_sums_wrap_and_bool_sums_are_logical_or():
    got = cases.reduce_ranks([np.array([127, -128], np.int8), np.array([1, -1], np.int8)], "sum")
    np.testing.assert_array_equal(got, np.array([-128, 127], np.int8))
    a, b = np.array([True, False, False]), np.array([True, True, False])
    np.testing.assert_array_equal(cases.reduce_ranks([a, b], "sum"), [True, True, False])
    np.testing.assert_array_equal(cases.reduce_ranks([a, b], "max"), [True, True, False])
    np.testing.assert_array_equal(cases.reduce_ranks([a, b], "min"), [True, False, False])


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_float_inputs_are_small_integers_whose_sums_are_exact(dtype):
    xs = cases.inputs_for(8, 1000, dtype, seed=3)
    assert all(x.dtype == np.dtype(dtype) for x in xs)
    exact = sum(x.astype(np.int64) for x in xs)
    assert np.all(np.abs(np.stack(xs).astype(np.float64)) <= 8)
    np.testing.assert_array_equal(cases.reduce_ranks(xs, "sum").astype(np.int64), exact)


def test_references_of_the_data_movements():
    xs = [np.arange(4) + 10 * r for r in range(2)]
    gather = algorithms.builtin(C.ALL_GATHER, "ring", 2)
    np.testing.assert_array_equal(cases.expected(gather, xs, "sum")[1], [0, 1, 2, 3, 10, 11, 12, 13])
    a2a = algorithms.builtin(C.ALL_TO_ALL, "direct", 2)
    np.testing.assert_array_equal(cases.expected(a2a, xs, "sum")[0], [0, 1, 10, 11])
    np.testing.assert_array_equal(cases.expected(a2a, xs, "sum")[1], [2, 3, 12, 13])
    scatter = algorithms.builtin(C.REDUCE_SCATTER, "ring", 2)
    np.testing.assert_array_equal(cases.expected(scatter, xs, "max")[1], [12, 13])


# ---------------------------------------------------------------------------------------------------------------
# Sizes and offsets
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,plan", AT_2_AND_8, ids=[i for i, _ in AT_2_AND_8])
def test_256_mib_per_rank_is_the_larger_buffer_of_every_builtin_plan(name, plan):
    for dtype in (np.float32, ml_dtypes.bfloat16):
        size = np.dtype(dtype).itemsize
        elements = cases.elements_for_bytes(plan, cases.LARGE_BYTES, dtype)
        assert elements % plan.in_blocks == 0
        block = elements // plan.in_blocks
        larger = max(elements, block * plan.out_blocks) * size
        assert cases.LARGE_BYTES - max(plan.in_blocks, plan.out_blocks) * size < larger <= cases.LARGE_BYTES


def test_256_mib_per_rank_in_the_nccl_tests_convention():
    f32 = np.float32
    at8 = lambda c, a: algorithms.builtin(c, a, 8)
    assert cases.elements_for_bytes(at8(C.ALL_REDUCE, "ring"), cases.LARGE_BYTES, f32) == 64 << 20
    assert cases.elements_for_bytes(at8(C.ALL_GATHER, "ring"), cases.LARGE_BYTES, f32) == 8 << 20  # 32 MiB in
    assert cases.elements_for_bytes(at8(C.REDUCE_SCATTER, "ring"), cases.LARGE_BYTES, f32) == 64 << 20
    with pytest.raises(ValueError, match="elements_for_bytes: 4 bytes"):
        cases.elements_for_bytes(at8(C.ALL_GATHER, "ring"), 4, f32)


@pytest.mark.parametrize("dtype", cases.DTYPES)
@pytest.mark.parametrize("n", range(2, 9))
def test_misaligned_offsets_leave_no_common_vector_peel(n, dtype):
    per_vector = cases.VECTOR_BYTES // np.dtype(dtype).itemsize
    for seed in range(5):
        for offsets in cases.misaligned_offsets(n, dtype, seed):
            assert len(offsets) == n and all(0 <= o < per_vector for o in offsets)
            assert len(set(offsets)) > 1  # some rank is not where another is: no one peel aligns them all


# ---------------------------------------------------------------------------------------------------------------
# The cases on the CPU executor
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,plan", AT_3_AND_8, ids=[i for i, _ in AT_3_AND_8])
def test_builtin_cases_hold_on_the_cpu_executor(name, plan):
    for dtype in (np.float16, ml_dtypes.bfloat16, np.int8, np.bool_):
        for op in cases.ops_for(plan):
            run(plan, plan.in_blocks * 37, dtype, op)
    run(plan, plan.in_blocks, np.float32)  # one element per block


@pytest.mark.parametrize("name,plan", AT_5, ids=[i for i, _ in AT_5])
def test_misaligned_inputs_hold_on_the_cpu_executor(name, plan):
    for dtype in (np.float16, np.float64):
        offsets = cases.misaligned_offsets(plan.nranks, dtype)
        run(plan, plan.in_blocks * 1001, dtype, offsets=offsets)


def test_a_wrong_output_is_reported_naming_the_rank():
    plan = algorithms.builtin(C.ALL_REDUCE, "ring", 4)

    def wrong(*args, **kw):
        outs, info = cases.run_cpu(*args, **kw)
        outs[3] = outs[3].copy()
        outs[3][5] += 1
        return outs, info

    with pytest.raises(AssertionError, match="rank 3 of"):
        cases.run_and_compare(wrong, plan, 40, np.float32)


def test_language_cases_hold_on_the_cpu_executor():
    plans = cases.language_plans()
    assert len(plans) >= 10
    for _, plan in plans:
        run(plan, plan.in_blocks * 37, np.float32)
        run(plan, plan.in_blocks * 1000, ml_dtypes.bfloat16)


def test_synthesized_cases_cover_every_8_rank_preset_and_collective():
    seen = cases.synthesized_cases()
    assert {(p, c) for p, c, _ in seen} == {(p, c) for p in cases.SYNTH_PRESETS for c in cases.SYNTH_COLLECTIVES}
    for p in cases.SYNTH_PRESETS:
        assert cases._topology(p).nranks == 8
        names = {name for q, _, name in seen if q == p}
        assert {"ring", "direct", "forest"} <= names, (p, names)


@pytest.mark.parametrize("collective", cases.SYNTH_COLLECTIVES)
def test_synthesized_ring_and_direct_cases_hold_on_the_cpu_executor(collective):
    for candidate in ("ring", "direct"):
        plan = cases.synthesized_plan("dgx-h100", collective, candidate)
        assert plan.nranks == 8
        run(plan, plan.in_blocks * 257, np.float16, "max")
