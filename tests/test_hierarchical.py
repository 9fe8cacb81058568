"""The hierarchical plans (jaxcoll.algorithms.hierarchical) for groups spanning processes: for several process
layouts, the checker proves each plan and the CPU executor's results equal numpy; "auto" picks them exactly when
a group spans processes; the lowering's process layout is shared by every group or not used."""

import numpy as np
import pytest

from jaxcoll import algorithms, runtime
from jaxcoll.algorithms import hierarchical, tuning
from jaxcoll.lang import check
from jaxcoll.plan import Collective
from jaxcoll.lowering.groups import process_layout

LAYOUTS = [(0, 0, 1, 1), (0, 1, 0, 1), (0, 0, 0, 0, 1, 1, 1, 1), (0, 0, 1, 1, 2, 2), (7, 7, 3, 3), (0, 1)]


def reference(collective: str, xs: list[np.ndarray]) -> list[np.ndarray]:
    n = len(xs)
    total = np.sum(np.stack(xs).astype(np.float64), axis=0).astype(xs[0].dtype)
    if collective == "all_reduce":
        return [total] * n
    if collective == "reduce_scatter":
        return np.split(total, n)
    if collective == "all_gather":
        return [np.concatenate(xs)] * n
    return [np.concatenate([np.split(x, n)[r] for x in xs]) for r in range(n)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "".join(map(str, t)))
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_hierarchical_plans_are_proved_and_equal_numpy(collective, layout, dtype):
    n = len(layout)
    plan = algorithms.builtin(Collective(collective), "hierarchical", n, processes=layout)
    check(plan)
    rng = np.random.default_rng(n)
    xs = [rng.integers(-3, 4, (n * 7,)).astype(dtype) for _ in range(n)]  # 7 elements a block: uneven chunks
    for got, want in zip(runtime.run_plan(plan, xs), reference(collective, xs)):
        np.testing.assert_array_equal(got, want)


def test_hierarchical_all_reduce_gives_every_rank_identical_bits():
    layout = (0, 0, 0, 1, 1, 1)
    plan = algorithms.builtin(Collective.ALL_REDUCE, "hierarchical", 6, processes=layout)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(6 * 50).astype(np.float32) for _ in range(6)]
    outs = runtime.run_plan(plan, xs)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    np.testing.assert_allclose(outs[0], np.sum(xs, axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
def test_uneven_processes_are_refused_by_name(collective):
    with pytest.raises(ValueError, match=r"same number of ranks in every process, got processes=\(0, 0, 0, 1\)"):
        algorithms.builtin(Collective(collective), "hierarchical", 4, processes=(0, 0, 0, 1))


def test_auto_picks_hierarchical_only_across_processes():
    spanning = (0, 0, 0, 0, 1, 1, 1, 1)
    for c in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        assert tuning.auto(Collective(c), 8, 1 << 20, spanning) == "hierarchical"
        assert tuning.auto(Collective(c), 8, 1 << 20, ()) != "hierarchical"
        assert tuning.auto(Collective(c), 8, 1 << 20, (0,) * 8) != "hierarchical"
    # Uneven processes: the gathers still pull, the reductions fall back to the one-process choice.
    assert tuning.auto(Collective.ALL_GATHER, 4, 1 << 20, (0, 0, 0, 1)) == "hierarchical"
    assert tuning.auto(Collective.ALL_REDUCE, 4, 1 << 20, (0, 0, 0, 1)) == "two_shot"
    assert hierarchical.uniform((5, 5, 9, 9)) and not hierarchical.uniform((5, 9, 9))


def test_the_process_layout_is_shared_by_every_group_or_dropped():
    # 2 groups of 4 ranks: both split 2 + 2 over their processes (labels differ, layout does not).
    same = np.array([0, 0, 1, 1, 2, 2, 3, 3], np.int32)
    assert process_layout(same, 4) == (0, 0, 1, 1)
    differ = np.array([0, 0, 1, 1, 2, 3, 2, 3], np.int32)
    assert process_layout(differ, 4) is None
    assert process_layout(None, 4) is None
