"""The emulated-rank harness's cases and their numpy references: which plans run (built-in, synthesized from the
8-rank presets, language-written), at which sizes and buffer offsets, with which inputs, and what every rank must
hold afterwards. test_cuda.py runs them on the GPU; test_cuda_cases.py runs the same cases on the CPU executor,
so a wrong case or reference is found here, without a GPU, and a GPU round's failure points at the GPU.

An executor is a function run(words, inputs, output_shape, reduce_op, protocol=..., blocks_per_lane=..., calls=...,
input_offsets=..., output_offsets=...) -> (outputs, info), the signature of runtime.run_words_cuda.
"""

from __future__ import annotations

import functools
from typing import Callable

import ml_dtypes
import numpy as np

from jaxcoll import algorithms, runtime
from jaxcoll.plan import Plan, abi, encode
from jaxcoll.plan.ir import Collective as C

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint32,
          np.bool_]
OPS = ["sum", "max", "min"]
PROTOCOLS = ["ll", "bulk"]
REDUCING = {C.ALL_REDUCE, C.REDUCE_SCATTER}

MiB = 1 << 20
# Issue 14's largest message: a rank's larger buffer (input or output) at 256 MiB. Eight ranks' inputs, outputs
# and slots of that size fit an H100's 78 GiB many times over; the host copies fit a GPU machine's 128 GiB.
LARGE_BYTES = 256 * MiB
# Elements per input block: one element, odd counts (scalar heads and tails around 16-byte vectors), a count
# just past a block's share of a thread block's 512 threads x 2 vectors, and one past a mebibyte of float32.
ODD_BLOCK_ELEMENTS = (1, 3, 37, 4097, (1 << 18) + 3)
# The kernel moves 16-byte vectors where one peel aligns every operand; offsets below this many bytes, different
# per rank, leave no common peel.
VECTOR_BYTES = 16

Executor = Callable[..., tuple]


# ---------------------------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------------------------
def builtin_plan(collective: C, name: str, n: int) -> Plan:
    if collective is C.BROADCAST:
        return algorithms.builtin(collective, name, n, root=n // 2)
    if collective is C.PPERMUTE:
        return algorithms.builtin(collective, name, n, perm=tuple((r, (r + 1) % n) for r in range(n - 1)))
    return algorithms.builtin(collective, name, n)


def builtin_plans(sizes=range(2, 9)) -> list[tuple[str, Plan]]:
    """(id, plan) for every built-in algorithm of every collective, for each group size in `sizes`."""
    return [(f"{collective.value}-{name}-{n}", builtin_plan(collective, name, n))
            for collective, names in algorithms.BUILTINS.items() for name in names for n in sizes]


# The presets of 8 ranks (jaxcoll.topology.PRESETS) and the collectives synthesis covers.
SYNTH_PRESETS = ("dgx1", "dgx-a100", "dgx-h100", "mi250")
SYNTH_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


@functools.lru_cache(maxsize=None)
def _topology(name: str):
    from jaxcoll.topology import preset
    return preset(name)  # one object per preset, so the synthesizer's per-topology cache is shared


def synthesized_cases() -> list[tuple[str, str, str]]:
    """(preset, collective, candidate) for every plan the synthesizer considers on each 8-rank preset, not only
    the one it would choose at some size: the candidates' names are known without building any (collection
    stays cheap)."""
    from jaxcoll.synth.select import candidates
    return [(p, c, name) for p in SYNTH_PRESETS for c in SYNTH_COLLECTIVES for name in candidates(_topology(p), c)]


def synthesized_plan(preset_name: str, collective: str, candidate: str) -> Plan:
    from jaxcoll.synth.select import plan_named
    return plan_named(_topology(preset_name), collective, candidate)[0]


def language_plans() -> list[tuple[str, Plan]]:
    """The language examples whose collective has a numpy reference here (not the custom ones)."""
    from test_lang_plans import example_plans
    return [(name, plan) for name, plan in example_plans() if plan.collective in
            (C.ALL_REDUCE, C.ALL_GATHER, C.REDUCE_SCATTER, C.ALL_TO_ALL, C.BROADCAST, C.PPERMUTE)]


# ---------------------------------------------------------------------------------------------------------------
# Sizes and offsets
# ---------------------------------------------------------------------------------------------------------------
def elements_for_bytes(plan: Plan, nbytes: int, dtype) -> int:
    """A rank's input elements such that its larger buffer (input or output) holds at most `nbytes` and the input
    splits into the plan's in_blocks: 256 MiB per rank means 256 MiB in and out for all_reduce, 32 MiB in and
    256 MiB out for an 8-rank all_gather, 256 MiB in and 32 MiB out for reduce_scatter."""
    return plan.elements_for_bytes(nbytes, np.dtype(dtype).itemsize)[0]


def misaligned_offsets(n: int, dtype, seed: int = 0) -> tuple[list[int], list[int]]:
    """(input_offsets, output_offsets): elements past an aligned base for each of n ranks, each below one vector
    (16 bytes) and, where a vector holds more than one element, not all equal, so no one peel aligns every
    rank's buffers and the kernel's element-by-element path and vector peels both run."""
    per_vector = max(VECTOR_BYTES // np.dtype(dtype).itemsize, 1)
    rng = np.random.default_rng(seed)
    out = []
    for shift in (0, 1):
        offsets = [(r + shift + int(rng.integers(per_vector))) % per_vector for r in range(n)]
        if per_vector > 1 and len(set(offsets)) == 1:
            offsets[0] = (offsets[0] + 1) % per_vector
        out.append(offsets)
    return out[0], out[1]


# ---------------------------------------------------------------------------------------------------------------
# Inputs and references (numpy)
# ---------------------------------------------------------------------------------------------------------------
def inputs_for(n: int, elements: int, dtype, seed: int = 0) -> list[np.ndarray]:
    """Floats are small integers, so every partial sum is exact in float16/bfloat16 and the order in which a
    plan reduces cannot change the result; integers span their whole range (sums wrap)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return [rng.random(elements, dtype=np.float32) < 0.5 for _ in range(n)]
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return [rng.integers(info.min, info.max, elements, dtype=dtype, endpoint=True) for _ in range(n)]
    # int8 draws, then one conversion: a quarter of the memory of int64 draws at 256 MiB per rank.
    return [rng.integers(-8, 9, elements, dtype=np.int8).astype(dtype) for _ in range(n)]


def reduce_ranks(xs: list[np.ndarray], op: str) -> np.ndarray:
    dtype = xs[0].dtype
    if dtype == np.bool_:
        return functools.reduce(np.logical_and if op == "min" else np.logical_or, xs)
    if op == "sum":
        if np.issubdtype(dtype, np.integer):
            return functools.reduce(lambda a, b: np.add(a, b, dtype=dtype), xs)  # wraps, as the executor does
        # Sums of at most 8 values in [-8, 8] are exact in float32; float64 sums stay float64.
        acc = xs[0].astype(np.float64 if dtype == np.float64 else np.float32)
        for x in xs[1:]:
            acc += x
        return acc.astype(dtype)
    return functools.reduce(np.maximum if op == "max" else np.minimum, xs)


def expected(plan: Plan, xs: list[np.ndarray], op: str) -> list[np.ndarray]:
    """Every rank's output by the collective's definition."""
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


def ops_for(plan: Plan) -> list[str]:
    return OPS if plan.collective in REDUCING else ["sum"]


def run_and_compare(run: Executor, plan: Plan, elements: int, dtype, op: str = "sum", protocol: str = "auto",
                    calls: int = 1, blocks_per_lane: int = 0, seed: int = 0, offsets=None,
                    timeout_s: float = 30.0, staged: bool = False) -> dict:
    """Run `plan` on `run` with `elements` per rank and compare every rank's output with numpy; returns the run's
    info. `offsets` is (input_offsets, output_offsets) or None. AssertionError names the rank and the case."""
    xs = inputs_for(plan.nranks, elements, dtype, seed)
    input_offsets, output_offsets = offsets or (None, None)
    outs, info = run(encode(plan), xs, runtime.output_shape(plan, xs[0].shape), abi.REDUCE_OP_CODES[op],
                     timeout_s=timeout_s, protocol=protocol, blocks_per_lane=blocks_per_lane, calls=calls,
                     input_offsets=input_offsets, output_offsets=output_offsets, **({"staged": True} if staged else {}))
    for r, (got, want) in enumerate(zip(outs, expected(plan, xs, op))):
        if not np.array_equal(got, want):  # the quick check first: 256 MiB per rank compares in a blink
            np.testing.assert_array_equal(got, want, err_msg=(
                f"rank {r} of {plan.name or plan.collective.value} ({np.dtype(dtype).name} x {elements}, {op}, "
                f"offsets {offsets}, {info})"))
    return info


def run_cpu(words, inputs, output_shape, reduce_op, *, timeout_s=30.0, protocol="auto", blocks_per_lane=0,
            calls=1, input_offsets=None, output_offsets=None):
    """The CPU executor behind the harness's signature. Protocols and blocks are the GPU's; input offsets are
    kept (each input starts that many elements into a larger array); outputs are numpy's own allocations."""
    if input_offsets is not None:
        inputs = [_at_offset(x, off) for x, off in zip(inputs, input_offsets)]
    outs = None
    for _ in range(max(calls, 1)):
        outs = runtime.run_words(words, inputs, output_shape, reduce_op, timeout_s)
    return outs, {"executor": "cpu", "protocol": protocol}


def _at_offset(x: np.ndarray, offset: int) -> np.ndarray:
    base = np.zeros(x.size + offset, x.dtype)
    view = base[offset:]
    view[...] = x.reshape(-1)
    return view.reshape(x.shape)
