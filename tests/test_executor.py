"""The C++ CPU executor, driven through jaxcoll.runtime: hand-built plans run on one thread per rank and are
compared with numpy; malformed plans and plans that never finish fail with messages a user can act on; and the
FFI target runs inside jax.jit(jax.shard_map) on 8 CPU devices."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxcoll import runtime
from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step, encode, validate
from jaxcoll.plan import abi, layout
from sharded import memory_after_release, settled_memory

IN, OUT, SCR = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
TIMEOUT_S = 60.0  # a broken plan fails the test in a minute instead of the default five


def run(plan, xs, op="sum", timeout_s=TIMEOUT_S):
    return runtime.run_plan(plan, xs, op=op, timeout_s=timeout_s)


@pytest.fixture(autouse=True, params=["solo", "threaded"])
def execution_mode(request):
    """Every test runs both ways: small calls run solo (one thread runs every rank's lanes), large ones with one
    thread per rank; the threshold is moved so both paths see the same plans."""
    from jaxcoll import _jaxcoll
    before = _jaxcoll.solo_bytes()
    _jaxcoll.set_solo_bytes(1 << 50 if request.param == "solo" else 0)
    yield request.param
    _jaxcoll.set_solo_bytes(before)


def ref(rank, buf, index, count=1):
    return ChunkRef(rank, buf, index, count)


# ---------------------------------------------------------------------------------------------------------------
# Hand-built plans
# ---------------------------------------------------------------------------------------------------------------
def direct_all_reduce(n: int, k: int = 1) -> Plan:
    """Rank r reduces chunk position r of every rank's input and writes the result to every rank's output."""
    ranks = []
    for r in range(n):  # rank r owns the chunk positions congruent to r mod n
        steps = [Step(Op.READ_REDUCE, tuple(ref(p, IN, c) for p in range(n)), tuple(ref(p, OUT, c) for p in range(n)))
                 for c in range(k) if c % n == r]
        ranks.append(RankProgram(k, k, 0, 0, (Lane(tuple(steps)),)))
    return validate(Plan(Collective.ALL_REDUCE, n, tuple(ranks), name="direct"))


def ring_all_reduce(n: int) -> Plan:
    """Ring reduce-scatter through the receiver's scratch, then ring all-gather; signal/wait order the ring.
    Needs n >= 2."""
    ranks = []
    for r in range(n):
        nxt = (r + 1) % n
        steps = [Step(Op.PUT, (ref(r, IN, (r - 1) % n),), (ref(nxt, SCR, (r - 1) % n),)), Step(Op.SIGNAL, peer=nxt, sem=0)]
        for s in range(1, n - 1):
            c = (r - s - 1) % n
            steps += [Step(Op.WAIT, sem=0),
                      Step(Op.REDUCE_PUT, (ref(r, SCR, c), ref(r, IN, c)), (ref(nxt, SCR, c),)),
                      Step(Op.SIGNAL, peer=nxt, sem=0)]
        steps += [Step(Op.WAIT, sem=0), Step(Op.REDUCE, (ref(r, SCR, r), ref(r, IN, r)), (ref(r, OUT, r),))]
        for t in range(n - 1):
            if t:
                steps.append(Step(Op.WAIT, sem=1))
            c = (r - t) % n
            steps += [Step(Op.PUT, (ref(r, OUT, c),), (ref(nxt, OUT, c),)), Step(Op.SIGNAL, peer=nxt, sem=1)]
        steps.append(Step(Op.WAIT, sem=1))
        ranks.append(RankProgram(n, n, n, 2, (Lane(tuple(steps)),)))
    return validate(Plan(Collective.ALL_REDUCE, n, tuple(ranks), name="ring"))


def direct_all_gather(n: int, in_place: bool = False) -> Plan:
    ranks = []
    for r in range(n):
        dsts = tuple(ref(p, OUT, r) for p in range(n) if not (in_place and p == r))
        ranks.append(RankProgram(1, n, 0, 0, (Lane((Step(Op.PUT, (ref(r, IN, 0),), dsts),)),)))
    return validate(Plan(Collective.ALL_GATHER, n, tuple(ranks), in_place=in_place))


def direct_reduce_scatter(n: int, in_place: bool = False) -> Plan:
    ranks = []
    for r in range(n):
        step = Step(Op.READ_REDUCE, tuple(ref(p, IN, r) for p in range(n)), (ref(r, OUT, 0),))
        ranks.append(RankProgram(n, 1, 0, 0, (Lane((step,)),)))
    return validate(Plan(Collective.REDUCE_SCATTER, n, tuple(ranks), in_place=in_place))


def direct_all_to_all(n: int) -> Plan:
    ranks = []
    for r in range(n):
        steps = tuple(Step(Op.PUT, (ref(r, IN, p),), (ref(p, OUT, r),)) for p in range(n))
        ranks.append(RankProgram(n, n, 0, 0, (Lane(steps),)))
    return validate(Plan(Collective.ALL_TO_ALL, n, tuple(ranks)))


def in_place_all_reduce(n: int) -> Plan:
    """Rank r owns chunk r everywhere: it reads it from every rank and overwrites it there with the sum."""
    ranks = []
    for r in range(n):
        step = Step(Op.READ_REDUCE, tuple(ref(p, IN, r) for p in range(n)), tuple(ref(p, OUT, r) for p in range(n)))
        ranks.append(RankProgram(n, n, 0, 0, (Lane((step,)),)))
    return validate(Plan(Collective.ALL_REDUCE, n, tuple(ranks), in_place=True))


def two_lane_all_reduce(n: int) -> Plan:
    """Two lanes per rank, k=2: lane 0 reduces chunk position 0 into scratch and signals lane 1 of the same rank;
    lane 1 reduces position 1, waits for the signal, then both lanes meet at a barrier before lane 0 publishes
    the scratch result to every output (so a barrier orders lane 1's copy before lane 0's)."""
    ranks = []
    for r in range(n):
        c0, c1 = 2 * r, 2 * r + 1  # k = 2n chunks: rank r owns positions 2r and 2r+1
        lane0 = (Step(Op.READ_REDUCE, tuple(ref(p, IN, c0) for p in range(n)), (ref(r, SCR, c0),)),
                 Step(Op.SIGNAL, peer=r, sem=0),
                 Step(Op.BARRIER),
                 Step(Op.PUT, (ref(r, SCR, c0),), tuple(ref(p, OUT, c0) for p in range(n))))
        lane1 = (Step(Op.READ_REDUCE, tuple(ref(p, IN, c1) for p in range(n)), tuple(ref(p, OUT, c1) for p in range(n))),
                 Step(Op.WAIT, sem=0),
                 Step(Op.COPY, (ref(r, SCR, c0),), (ref(r, SCR, c0 + 2 * n),)),
                 Step(Op.BARRIER))
        ranks.append(RankProgram(2 * n, 2 * n, 4 * n, 1, (Lane(lane0), Lane(lane1))))
    return validate(Plan(Collective.ALL_REDUCE, n, tuple(ranks), name="two-lane"))


# ---------------------------------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------------------------------
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint32,
          np.bool_]


def reduce_ref(xs, op: str):
    """The executor's contract: reduce in rank order in the accumulation type, round once."""
    dtype = xs[0].dtype
    acc_t = np.float32 if dtype in (np.float16, ml_dtypes.bfloat16) else dtype
    acc = xs[0].astype(acc_t)
    for x in xs[1:]:
        x = x.astype(acc_t)
        if dtype == np.bool_:
            acc = (acc & x) if op == "min" else (acc | x)
        elif op == "sum":
            acc = acc + x
        else:
            acc = np.maximum(acc, x) if op == "max" else np.minimum(acc, x)
    return acc.astype(dtype)


def random_inputs(n, shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return [rng.random(shape) < 0.5 for _ in range(n)]
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        return [rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True) for _ in range(n)]
    return [(rng.standard_normal(shape) * 4).astype(dtype) for _ in range(n)]


def assert_all_equal(outs, expected):
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(out, expected, err_msg=f"rank {r}")


# ---------------------------------------------------------------------------------------------------------------
# Collectives on the executor
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 8])
@pytest.mark.parametrize("make", [direct_all_reduce, ring_all_reduce, in_place_all_reduce, two_lane_all_reduce])
def test_all_reduce_plans_sum_every_rank(make, n):
    if make is ring_all_reduce and n == 1:
        pytest.skip("a ring needs two ranks")
    plan = make(n)
    xs = random_inputs(n, (4 * n * (plan.chunk_factor) + 3,), np.float32)
    outs = run(plan, xs)
    expected = reduce_ref(xs, "sum") if make is not ring_all_reduce else None
    if expected is None:  # the ring adds in ring order; compare with a tolerance, then check every rank agrees
        np.testing.assert_allclose(outs[0], sum(x.astype(np.float64) for x in xs), rtol=1e-5, atol=1e-5)
        expected = outs[0]
    assert_all_equal(outs, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_every_dtype_and_op_reduces_in_rank_order_and_rounds_once(dtype, op):
    n = 8
    xs = random_inputs(n, (2, 1000), dtype, seed=hash((np.dtype(dtype).name, op)) % 2**32)
    outs = run(direct_all_reduce(n), xs, op=op)
    assert outs[0].dtype == np.dtype(dtype) and outs[0].shape == (2, 1000)
    assert_all_equal(outs, reduce_ref(xs, op))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["sum", "max"])
def test_sources_of_both_representations_reduce_in_order(dtype, op):
    """One step reads nine sources, two of them float32 partials in scratch among data-type inputs: the kernel
    folds several sources per pass over its accumulator, yet the result is the rank-order reduction in the
    accumulation type, rounded once, bit for bit; 3,001 elements span two tiles and a ragged end."""
    n = 9
    ranks = []
    for r in range(n):
        steps = ()
        if r == 0:  # partials of ranks 5 and 6 staged in rank 0's scratch, then every source reduced in rank order
            srcs = tuple(ref(p, IN, 0) for p in range(5)) + (ref(0, SCR, 0), ref(0, SCR, 1)) + \
                tuple(ref(p, IN, 0) for p in range(7, n))
            steps = (Step(Op.GET, (ref(5, IN, 0),), (ref(0, SCR, 0),)),
                     Step(Op.GET, (ref(6, IN, 0),), (ref(0, SCR, 1),)),
                     Step(Op.READ_REDUCE, srcs, tuple(ref(p, OUT, 0) for p in range(n))))
        ranks.append(RankProgram(1, 1, 2, 0, (Lane(steps),)))
    plan = validate(Plan(Collective.ALL_REDUCE, n, tuple(ranks), name="mixed-sources"))
    xs = random_inputs(n, (3001,), dtype, seed=7)
    assert_all_equal(run(plan, xs, op=op), reduce_ref(xs, op))


def test_float_max_and_min_propagate_nan():
    xs = [np.array([1.0, np.nan, 3.0], np.float32), np.array([np.nan, 2.0, 1.0], np.float32)]
    for op, want in [("max", [np.nan, np.nan, 3.0]), ("min", [np.nan, np.nan, 1.0])]:
        outs = run(direct_all_reduce(2), xs, op=op)
        np.testing.assert_array_equal(outs[1], np.array(want, np.float32))


def test_16bit_partials_through_scratch_round_once():
    """The ring keeps partial sums in float32 scratch: the result is the float32 ring-order sum rounded once."""
    n = 4
    xs = [np.full(8, v, np.float16) for v in (2048.0, 1.0, 1.0, 0.5)]  # 2048+1 is not a float16
    outs = run(ring_all_reduce(n), xs)
    # chunk c's ring order starts at rank c+1; every order gives 2050.5 in float32, 2050 in float16 (ties to even)
    assert_all_equal(outs, np.full(8, 2050.0, np.float16))


@pytest.mark.parametrize("n", [2, 5, 8])
@pytest.mark.parametrize("in_place", [False, True])
def test_all_gather_concatenates_rank_blocks(n, in_place):
    xs = random_inputs(n, (3, 7), np.int32)
    outs = run(direct_all_gather(n, in_place), xs)
    assert_all_equal(outs, np.concatenate(xs))


@pytest.mark.parametrize("n", [2, 5, 8])
@pytest.mark.parametrize("in_place", [False, True])
def test_reduce_scatter_gives_rank_r_block_r_of_the_sum(n, in_place):
    xs = random_inputs(n, (4 * n, 3), np.float64)
    outs = run(direct_reduce_scatter(n, in_place), xs)
    total = reduce_ref(xs, "sum")
    for r in range(n):
        np.testing.assert_array_equal(outs[r], total[4 * r:4 * (r + 1)], err_msg=f"rank {r}")


@pytest.mark.parametrize("n", [2, 3, 8])
def test_all_to_all_transposes_blocks(n):
    xs = [np.arange(n * 5, dtype=np.int64).reshape(n, 5) + 1000 * r for r in range(n)]
    outs = run(direct_all_to_all(n), xs)
    for r in range(n):
        np.testing.assert_array_equal(outs[r], np.stack([xs[p][r] for p in range(n)]), err_msg=f"rank {r}")


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_calls_large_enough_to_stream_past_the_caches_give_the_same_results(dtype):
    """Calls that move at least 32 MiB write their steps of 256 KiB and more with non-temporal stores (the
    reduction kernel's, with a conversion for bfloat16, and the copies'); smaller calls use ordinary stores."""
    n = 8
    xs = random_inputs(n, (n * (1 << 17) + 5,), dtype)  # 8 chunks of >= 256 KiB per rank: 64 MiB moved or more
    assert_all_equal(run(direct_all_reduce(n, n), xs), reduce_ref(xs, "sum"))
    assert_all_equal(run(direct_all_gather(n, False), xs), np.concatenate(xs))


@pytest.mark.parametrize("elements", [0, 1, 2, 5, 13, 1001])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_uneven_sizes_follow_the_chunk_layout(elements, k):
    n = 4
    xs = random_inputs(n, (elements,), np.float32)
    outs = run(direct_all_reduce(n, k * n), xs)
    assert_all_equal(outs, reduce_ref(xs, "sum"))


def test_zero_fills_outputs_nobody_writes():
    steps = (Step(Op.ZERO, dsts=(ref(0, OUT, 0),)),)
    plan = validate(Plan(Collective.PPERMUTE, 2, (RankProgram(1, 1, 0, 0, (Lane(steps),)),
                                                   RankProgram(1, 1, 0, 0, (Lane((Step(Op.PUT, (ref(1, IN, 0),), (ref(1, OUT, 0),)),)),)))))
    outs = run(plan, [np.ones(6, np.float32), np.full(6, 7, np.float32)])
    np.testing.assert_array_equal(outs[0], np.zeros(6, np.float32))
    np.testing.assert_array_equal(outs[1], np.full(6, 7, np.float32))


def test_repeated_runs_reset_semaphores():
    plan = ring_all_reduce(4)
    xs = random_inputs(4, (64,), np.int32)
    for _ in range(5):
        assert_all_equal(run(plan, xs), reduce_ref(xs, "sum"))


@given(k=st.integers(1, 16), block=st.integers(0, 10_000), index=st.integers(0, 64), count=st.integers(1, 16))
def test_chunk_layout_matches_the_python_rule(k, block, index, count):
    from jaxcoll import _jaxcoll
    assert _jaxcoll.chunk_range(k, block, index, count) == layout.chunk_range(k, block, index, count)


@given(n=st.integers(1, 8), kmul=st.integers(1, 3), elements=st.integers(0, 300),
       dtype=st.sampled_from([np.float32, np.float16, np.int8, ml_dtypes.bfloat16]),
       op=st.sampled_from(["sum", "max", "min"]))
def test_direct_all_reduce_matches_numpy_for_any_size(n, kmul, elements, dtype, op):
    xs = random_inputs(n, (elements,), dtype, seed=elements)
    assert_all_equal(run(direct_all_reduce(n, n * kmul), xs, op=op), reduce_ref(xs, op))


# ---------------------------------------------------------------------------------------------------------------
# Malformed plans and bad calls
# ---------------------------------------------------------------------------------------------------------------
def test_every_truncation_of_a_plan_is_rejected_with_a_message():
    words = encode(ring_all_reduce(3))
    for cut in range(len(words)):
        with pytest.raises(ValueError, match="malformed jaxcoll plan"):
            runtime.check_words(words[:cut])
    runtime.check_words(words)


@pytest.mark.parametrize("position, value, message", [
    (0, 1234, "not a jaxcoll plan"),
    (1, 2, "not a jaxcoll plan"),
    (2, 99, "unknown collective"),
    (3, 0, "nranks >= 1"),
    (3, 10**9, "truncated"),
    (7, 9, "unknown protocol"),
])
def test_corrupt_header_words_are_named(position, value, message):
    words = encode(direct_all_reduce(2)).copy()
    words[position] = value
    with pytest.raises(ValueError, match=message):
        runtime.check_words(words)


def _first_step_word(plan: Plan) -> int:
    return 8 + 5 + 1  # header, rank 0's program, its first lane's step count


@pytest.mark.parametrize("offset, value, message", [
    (0, 42, "unknown op code"),
    (3, -1, "negative or exceed"),
    (5, 7, "out of range for nranks"),    # first src's rank
    (6, 5, "unknown buffer code"),         # first src's buffer
    (7, 99, "out of range"),               # first src's index
    (8, 0, "count must be >= 1"),          # first src's count
])
def test_corrupt_step_words_are_named(offset, value, message):
    plan = direct_all_reduce(2)
    words = encode(plan).copy()
    words[_first_step_word(plan) + offset] = value
    with pytest.raises(ValueError, match=message):
        runtime.check_words(words)


def test_trailing_words_are_rejected():
    words = np.concatenate([encode(direct_all_reduce(2)), np.zeros(3, np.int32)])
    with pytest.raises(ValueError, match="3 trailing words"):
        runtime.check_words(words)


def test_out_of_place_plan_writing_its_input_is_rejected():
    words = encode(direct_all_reduce(2)).copy()
    first_dst_buffer = _first_step_word(direct_all_reduce(2)) + 5 + 4 * 2 + 1
    words[first_dst_buffer] = 0  # output -> input
    with pytest.raises(ValueError, match="never writes its input"):
        runtime.check_words(words)


@given(data=st.data())
def test_random_corruption_never_crashes(data):
    words = encode(two_lane_all_reduce(3)).copy()
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(words) - 1))
        words[i] = data.draw(st.integers(-3, 2**31 - 1) | st.integers(-2, 12))
    cut = data.draw(st.integers(0, len(words)))
    try:
        runtime.check_words(words[:cut])
    except ValueError as e:
        assert str(e).startswith("malformed jaxcoll plan: ")


def test_mismatched_input_shapes_are_rejected():
    with pytest.raises(ValueError, match="every rank passes the same shape"):
        run(direct_all_reduce(2), [np.ones(4, np.float32), np.ones(5, np.float32)])


def test_input_that_does_not_split_into_blocks_is_rejected():
    with pytest.raises(ValueError, match="in_blocks=3"):
        run(direct_reduce_scatter(3), [np.ones(4, np.float32)] * 3)


def test_unsupported_dtype_is_rejected():
    with pytest.raises(ValueError, match="unsupported dtype complex64"):
        run(direct_all_reduce(2), [np.ones(4, np.complex64)] * 2)


def test_a_wait_that_is_never_signalled_times_out_naming_the_semaphore():
    steps0 = (Step(Op.WAIT, sem=0), Step(Op.PUT, (ref(0, IN, 0),), (ref(0, OUT, 0),)))
    steps1 = (Step(Op.PUT, (ref(1, IN, 0),), (ref(1, OUT, 0),)),)
    plan = Plan(Collective.CUSTOM, 2, (RankProgram(1, 1, 0, 1, (Lane(steps0),)), RankProgram(1, 1, 0, 0, (Lane(steps1),))),
                in_blocks=1, out_blocks=1)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        run(plan, [np.ones(4, np.float32)] * 2, timeout_s=0.3)
    message = str(info.value)
    assert "jaxcoll custom" in message and "rank 0" in message and "lane 0, step 0 (wait)" in message
    assert "semaphore 0" in message and "never signalled" in message and "JAXCOLL_TIMEOUT" in message
    assert time.monotonic() - start < 60  # it returned: the peer did not hang either


def test_a_failed_rank_releases_its_peers_promptly():
    """Rank 0 never gets its signal; rank 1 waits at the exit barrier and must be woken by rank 0's failure."""
    steps0 = (Step(Op.WAIT, sem=0),)
    plan = Plan(Collective.CUSTOM, 2, (RankProgram(1, 1, 0, 1, (Lane(steps0),)), RankProgram(1, 1, 0, 0, ())),
                in_blocks=1, out_blocks=1)
    with pytest.raises(RuntimeError, match="never signalled"):
        run(plan, [np.ones(2, np.int32)] * 2, timeout_s=0.2)


def chained_lanes(n: int, lanes: int) -> Plan:
    """Rank r copies its input to its output after rank r-1 has, then releases its other lanes, which only wait:
    a plan without barriers whose ranks spend their passes scanning many blocked lanes, so that a helper thread
    often holds a rank while the leader signals it."""
    ranks = []
    for r in range(n):
        first = ([Step(Op.WAIT, sem=0)] if r else []) + [Step(Op.COPY, (ref(r, IN, 0),), (ref(r, OUT, 0),))]
        first += ([Step(Op.SIGNAL, peer=r + 1, sem=0)] if r < n - 1 else []) + [Step(Op.SIGNAL, peer=r, sem=1)] * (lanes - 1)
        ranks.append(RankProgram(1, 1, 0, 2, (Lane(tuple(first)),) + (Lane((Step(Op.WAIT, sem=1),)),) * (lanes - 1)))
    return validate(Plan(Collective.CUSTOM, n, tuple(ranks), in_blocks=1, out_blocks=1, name="chain"))


@pytest.mark.parametrize("plan", [chained_lanes(8, 64), chained_lanes(2, 1000), ring_all_reduce(8)],
                         ids=["chain8", "chain2", "ring8"])
def test_plans_without_barriers_never_report_a_deadlock_while_helpers_hold_ranks(plan):
    """A pass that skipped a rank another thread held proves nothing about it: that thread may have read the rank's
    semaphores before a signal this one sent. Many calls, each shared with helper threads, must all finish."""
    xs = [np.full(32, r + 1.0, np.float32) for r in range(plan.nranks)]
    want = sum(xs) if plan.collective == Collective.ALL_REDUCE else None
    for _ in range(300):
        outs = run(plan, xs)
        for r, y in enumerate(outs):
            np.testing.assert_array_equal(y, xs[r] if want is None else want)


# ---------------------------------------------------------------------------------------------------------------
# Through XLA: the FFI target inside jax.jit(jax.shard_map) on 8 CPU devices
# ---------------------------------------------------------------------------------------------------------------
_CALLSITES = iter(range(10_000, 20_000))


def ffi_collective(plan: Plan, x, out_shape, axis="i", op=0):
    words = encode(plan)
    callsite = next(_CALLSITES)
    rank = jax.lax.axis_index(axis).astype(jnp.int32)
    return jax.ffi.ffi_call(abi.target_name(plan.collective), jax.ShapeDtypeStruct(out_shape, x.dtype),
                            has_side_effect=True)(x, rank, jnp.int32(0), plan=words, reduce_op=np.int32(op),
                                                  callsite=np.int64(callsite), processes=np.zeros(0, np.int32))


@pytest.fixture(scope="module")
def mesh8():
    return jax.make_mesh((8,), ("i",), devices=jax.devices()[:8])


@pytest.mark.parametrize("dtype", [np.float32, np.int32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_ffi_all_reduce_in_shard_map_matches_numpy(mesh8, dtype):
    xs = random_inputs(8, (3, 40), dtype)
    x = jax.device_put(np.concatenate(xs), NamedSharding(mesh8, P("i")))
    plan = ring_all_reduce(8) if dtype == np.int32 else direct_all_reduce(8)
    f = jax.jit(jax.shard_map(lambda b: ffi_collective(plan, b, b.shape), mesh=mesh8, in_specs=P("i"),
                              out_specs=P("i"), check_vma=False))
    expected = reduce_ref(xs, "sum")
    for _ in range(3):  # repeated launches meet call by call
        got = np.asarray(f(x)).reshape(8, 3, 40)
        for r in range(8):
            np.testing.assert_array_equal(got[r], expected, err_msg=f"rank {r}")


def test_ffi_call_site_in_a_loop_meets_once_per_iteration(mesh8):
    """A call site inside a loop runs several times in one launch: the n-th iteration on a rank meets the n-th
    on its peers (calls are paired by XLA's run id and the count of calls within it)."""
    xs = random_inputs(8, (24,), np.int32)
    x = jax.device_put(np.concatenate(xs), NamedSharding(mesh8, P("i")))
    plan = direct_all_reduce(8)

    def body(b):
        return jax.lax.fori_loop(0, 3, lambda i, acc: ffi_collective(plan, acc, acc.shape) - i, b)

    f = jax.jit(jax.shard_map(body, mesh=mesh8, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    expected = reduce_ref(xs, "sum")
    for i in range(1, 3):
        expected = (expected * 8 - i).astype(np.int32)
    got = np.asarray(f(x)).reshape(8, 24)
    for r in range(8):
        np.testing.assert_array_equal(got[r], expected, err_msg=f"rank {r}")


def test_ffi_all_gather_and_reduce_scatter_in_one_program(mesh8):
    xs = random_inputs(8, (16,), np.float32)
    x = jax.device_put(np.concatenate(xs), NamedSharding(mesh8, P("i")))
    ag, rs = direct_all_gather(8), direct_reduce_scatter(8)

    def body(b):
        gathered = ffi_collective(ag, b, (8 * b.shape[0],))
        return ffi_collective(rs, gathered, b.shape, op=1)  # max over ranks of the gathered rows

    f = jax.jit(jax.shard_map(body, mesh=mesh8, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    got = np.asarray(f(x)).reshape(8, 16)
    stacked = np.concatenate(xs)  # every rank gathered the same rows, so the max is that row block itself
    for r in range(8):
        np.testing.assert_array_equal(got[r], stacked[16 * r:16 * (r + 1)], err_msg=f"rank {r}")


def test_a_dropped_executable_frees_its_call_sites_scratch_and_staging(mesh8):
    """A call site's memory is its compiled calls': a program recompiled again and again (each lowering is a new call
    site) holds one compilation's scratch and staging at a time, not every one it ever compiled (each compilation of
    a ring all_reduce of 4 MiB a rank kept 32 MiB for the life of the process before)."""
    block = 1024  # float32 elements a rank: 4 KiB, whole pages, so the buffers hold exactly what the plans ask for
    xs = [(np.arange(8 * block) % 97 - r).astype(np.float32) for r in range(8)]  # integers: every sum is exact
    x = jax.device_put(np.concatenate(xs), NamedSharding(mesh8, P("i")))
    total = sum(xs)
    ring, scatter = ring_all_reduce(8), direct_reduce_scatter(8, in_place=True)
    # The closed form, from the plans: the ring's scratch holds one block a rank (scratch_chunks / chunk_factor),
    # the in-place reduce_scatter stages its whole input on every rank.
    expected = 8 * (ring.ranks[0].scratch_chunks // ring.chunk_factor * 8 * block * 4 + 8 * block * 4)

    def body(b):
        summed = ffi_collective(ring, b, b.shape)
        return ffi_collective(scatter, summed, (block,))

    jax.clear_caches()
    before = settled_memory()
    for _ in range(3):
        f = jax.jit(jax.shard_map(body, mesh=mesh8, in_specs=P("i"), out_specs=P("i"), check_vma=False))
        got = np.asarray(f(x)).reshape(8, block)
        for r in range(8):  # every rank holds the sum after the ring; block r of eight of them after the scatter
            np.testing.assert_array_equal(got[r], 8 * total[r * block:(r + 1) * block], err_msg=f"rank {r}")
        held = runtime.communicator_memory()
        assert held == (before[0] + 2, before[1] + expected), (before, held, expected)
        del f
        jax.clear_caches()
        assert memory_after_release(before[1]) == before


def test_ffi_malformed_plan_fails_at_compile_time_with_the_decoder_message(mesh8):
    words = encode(direct_all_reduce(8)).copy()
    words[2] = 99
    x = jax.device_put(np.zeros(8, np.float32), NamedSharding(mesh8, P("i")))

    def body(b):
        rank = jax.lax.axis_index("i").astype(jnp.int32)
        return jax.ffi.ffi_call("jaxcoll_all_reduce", jax.ShapeDtypeStruct(b.shape, b.dtype), has_side_effect=True)(
            b, rank, jnp.int32(0), plan=words, reduce_op=np.int32(0), callsite=np.int64(next(_CALLSITES)), processes=np.zeros(0, np.int32))

    f = jax.jit(jax.shard_map(body, mesh=mesh8, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    with pytest.raises(Exception, match="unknown collective code 99"):
        f(x).block_until_ready()


_MISSING_RANK_PROGRAM = """
import jax, jax.numpy as jnp
from jax import lax
import jaxcoll
jax.config.update("jax_num_cpu_devices", 8)
mesh = jax.make_mesh((8,), ("i",))
x = jax.device_put(jnp.ones((8 * 16,)), jax.NamedSharding(mesh, jax.P("i")))

def body(v):  # rank 3 skips the collective that every other rank calls
    return lax.cond(lax.axis_index("i") == 3, lambda t: t, lambda t: jaxcoll.all_reduce(t, "i"), v)

f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P("i"), check_vma=False))
try:
    jax.block_until_ready(f(x))
except Exception as e:
    print("ERROR:", e)
"""


def test_a_rank_that_never_arrives_fails_its_peers_after_the_timeout_naming_it(tmp_path):
    # Ranks that arrive first return pending and hold no thread; the watchdog fails them at the deadline.
    import os
    import subprocess
    import sys
    env = dict(os.environ, JAXCOLL_TIMEOUT="2")
    start = time.monotonic()
    # Run outside the checkout, so that `python -c` imports jaxcoll as this test session does (installed, or from
    # PYTHONPATH), never a checkout's unbuilt sources from the working directory.
    out = subprocess.run([sys.executable, "-c", _MISSING_RANK_PROGRAM], capture_output=True, text=True, env=env,
                         timeout=240, cwd=tmp_path)
    assert "ERROR:" in out.stdout, out.stdout + out.stderr
    message = out.stdout.split("ERROR:", 1)[1]
    assert "jaxcoll all_reduce" in message and "ranks that never arrived: [3]" in message
    assert "JAXCOLL_TIMEOUT" in message
    assert time.monotonic() - start < 200
