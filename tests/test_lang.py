"""The collective language: programs compile to plans the checker proves, and those plans compute their
collective on the real CPU executor and through JAX, against numpy and jax.lax references."""

import numpy as np
import pytest

from jaxcoll.lang import PlanError, check, chunk, program
from jaxcoll.lang.postcondition import value
from jaxcoll.plan import Buffer, Collective, Op
from test_lang_plans import example, example_plans

runtime = pytest.importorskip("jaxcoll.runtime", reason="the native runtime is not built", exc_type=ImportError)


def reference(plan, inputs, op="sum"):
    """What each rank's output must be, from numpy."""
    n = plan.nranks
    red = {"sum": np.sum, "max": np.max, "min": np.min}[op]
    if plan.collective is Collective.ALL_REDUCE:
        return [red(np.stack(inputs), axis=0)] * n
    if plan.collective is Collective.ALL_GATHER:
        return [np.concatenate(inputs)] * n
    if plan.collective is Collective.REDUCE_SCATTER:
        return list(np.split(red(np.stack(inputs), axis=0), n))
    if plan.collective is Collective.ALL_TO_ALL:
        blocks = [np.split(x, n) for x in inputs]
        return [np.concatenate([blocks[p][r] for p in range(n)]) for r in range(n)]
    if plan.name == "all_to_next":
        return [None] + inputs[:-1]
    raise AssertionError(plan)


def run_and_compare(plan, elements, op="sum", seed=0):
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(-50, 50, size=elements).astype(np.float32) for _ in range(plan.nranks)]
    got = runtime.run_plan(plan, inputs, op=op)
    for r, (g, want) in enumerate(zip(got, reference(plan, inputs, op))):
        if want is not None:
            np.testing.assert_array_equal(g, want, err_msg=f"rank {r} of {plan.name}")


@pytest.mark.parametrize("name,plan", example_plans(), ids=[i for i, _ in example_plans()])
def test_example_plans_run_on_the_executor(name, plan):
    blocks = plan.in_blocks
    run_and_compare(plan, blocks * 37)  # 37 elements per block: chunks of unequal size
    run_and_compare(plan, blocks * plan.chunk_factor * 2)


@pytest.mark.parametrize("op", ["max", "min"])
def test_ring_example_serves_max_and_min(op):
    run_and_compare(example("ring_all_reduce").ring_all_reduce(4), 40, op=op)


def test_copy_then_reduce_reads_like_the_whiteboard():
    with program("two", "all_reduce", 2) as p:
        chunk(0, "input", 0).copy(1, "scratch", 0)
        chunk(1, "input", 0).copy(1, "output", 0).reduce(chunk(1, "scratch", 0))
        chunk(1, "output", 0).copy(0, "output", 0)
    plan = p.plan()
    assert plan.collective is Collective.ALL_REDUCE and plan.nranks == 2
    ops = [s.op for _, _, _, s in plan.steps()]
    assert Op.SIGNAL in ops and Op.WAIT in ops  # the compiler ordered rank 0's put before rank 1's reduce
    run_and_compare(plan, 5)


def test_named_scratch_buffers_get_distinct_places():
    with program("named", "all_reduce", 2) as p:
        chunk(0, "input", 0).copy(1, "a", 0)
        chunk(1, "input", 0).copy(1, "b", 0)
        acc = chunk(1, "a", 0).copy(1, "output", 0).reduce(chunk(1, "b", 0))
        acc.copy(0, "output", 0)
    plan = p.plan()
    scratch = {ref.index for _, _, _, s in plan.steps() for ref in s.srcs + s.dsts if ref.buffer is Buffer.SCRATCH}
    assert scratch == {0, 1}
    assert plan.ranks[1].scratch_chunks == 2


def test_manual_lane_override_is_kept():
    with program("lanes", "all_gather", 2) as p:
        for r in range(2):
            chunk(r, "input", 0).copy(r, "output", r, lane=0)
            chunk(r, "input", 0).copy(1 - r, "output", r, lane=3)
    plan = p.plan()
    assert len(plan.ranks[0].lanes) == 4
    assert [s.op for s in plan.ranks[0].lanes[3].steps] == [Op.PUT]


def test_instances_replicate_over_finer_chunks_on_separate_lanes():
    ring = example("ring_all_reduce").ring_all_reduce
    one, two = ring(4), ring(4, instances=2)
    assert two.chunk_factor == 2 * one.chunk_factor
    assert len(two.ranks[0].lanes) == 2 * len(one.ranks[0].lanes)


def test_pipelining_splits_steps_into_single_chunk_pieces():
    with program("pipe", "all_gather", 2, chunks=1, pipeline=4) as p:
        for r in range(2):
            chunk(r, "input", 0).copy(r, "output", r)
            chunk(r, "input", 0).copy(1 - r, "output", r)
    plan = p.plan()
    assert plan.chunk_factor == 4
    assert all(ref.count == 1 for _, _, _, s in plan.steps() for ref in s.srcs + s.dsts)
    run_and_compare(plan, 10)


def test_program_that_computes_the_wrong_thing_is_rejected_at_plan():
    with program("wrong", "all_reduce", 2) as p:
        chunk(0, "input", 0).copy(0, "output", 0)
        chunk(1, "input", 0).copy(1, "output", 0)
    with pytest.raises(PlanError, match=r"rank 0: output chunk 0 holds r0.in\[0\], expected"):
        p.plan()
    assert p.plan(check=False).collective is Collective.ALL_REDUCE  # unchecked compile still builds it


def test_chunk_errors_name_the_argument():
    with pytest.raises(PlanError, match="outside"):
        chunk(0, "input", 0)
    with program("e", "all_reduce", 2, chunks=2) as p:
        with pytest.raises(PlanError, match=r"chunk\(0, 'input', 2, size=1\) is out of range: the input holds 2"):
            chunk(0, "input", 2)
        with pytest.raises(PlanError, match="rank 5 is out of range"):
            chunk(5, "output", 0)
        with pytest.raises(PlanError, match="sizes differ"):
            chunk(0, "output", 0, 2).reduce(chunk(1, "input", 0))
    with pytest.raises(PlanError, match="records no operations"):
        p.plan()


def test_custom_collective_states_its_postcondition():
    with program("shift", "custom", 3, in_blocks=1, out_blocks=1,
                 postcondition=lambda r, i: value([((r - 1) % 3, i)])) as p:
        for r in range(3):
            chunk(r, "input", 0).copy((r + 1) % 3, "output", 0)
    plan = p.plan()
    with pytest.raises(PlanError, match="expected r1.in"):
        check(plan, postcondition=lambda r, i: value([(1, i)]))


def test_in_place_program():
    with program("ip", "all_reduce", 2, in_place=True) as p:
        chunk(0, "input", 0).copy(1, "scratch", 0)
        chunk(1, "input", 0).reduce(chunk(1, "scratch", 0))
        chunk(1, "input", 0).copy(0, "input", 0)
    plan = p.plan()
    assert plan.in_place


jax = pytest.importorskip("jax")


def test_language_plan_runs_through_jax_all_reduce():
    import jaxcoll
    from sharded import per_rank, put, sharded
    plan = example("ring_all_reduce").ring_all_reduce(8)
    x = np.arange(8 * 3 * 5, dtype=np.float32).reshape(8, 3, 5)
    f = sharded(per_rank(lambda v: jaxcoll.all_reduce(v, "i", algorithm=plan)), "1d8")
    want = sharded(per_rank(lambda v: jax.lax.psum(v, "i")), "1d8")
    np.testing.assert_array_equal(np.asarray(f(put(x, "1d8"))), np.asarray(want(put(x, "1d8"))))


def test_language_all_to_all_runs_through_jax():
    import jaxcoll
    from sharded import per_rank, put, sharded
    plan = example("two_step_all_to_all").two_step_all_to_all(2, 4)
    x = np.arange(8 * 8 * 3, dtype=np.float32).reshape(8, 8, 3)
    f = sharded(per_rank(lambda v: jaxcoll.all_to_all(v, "i", 0, 0, algorithm=plan)), "1d8")
    want = sharded(per_rank(lambda v: jax.lax.all_to_all(v, "i", 0, 0)), "1d8")
    np.testing.assert_array_equal(np.asarray(f(put(x, "1d8"))), np.asarray(want(put(x, "1d8"))))


@pytest.mark.parametrize("build", ["all_pairs", "hierarchical"])
def test_language_all_reduce_max_through_jax(build):
    import jaxcoll
    from sharded import per_rank, put, sharded
    plan = (example("all_pairs_all_reduce").all_pairs_all_reduce(8) if build == "all_pairs"
            else example("hierarchical_all_reduce").hierarchical_all_reduce(2, 4))
    x = np.random.default_rng(3).normal(size=(8, 13)).astype(np.float32)
    f = sharded(per_rank(lambda v: jaxcoll.all_reduce(v, "i", op="max", algorithm=plan)), "1d8")
    want = sharded(per_rank(lambda v: jax.lax.pmax(v, "i")), "1d8")
    np.testing.assert_array_equal(np.asarray(f(put(x, "1d8"))), np.asarray(want(put(x, "1d8"))))
