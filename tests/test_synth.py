"""Synthesizers: the exact bound, the plans' correctness (proving checker and CPU executor against numpy), and
the selection's guarantees."""

import gc
import weakref
from fractions import Fraction

import numpy as np
import pytest

from jaxcoll.plan import Collective, validate
from jaxcoll.sim import simulate
from jaxcoll.synth import (evaluate, forest, hierarchical, lower_bound, min_cut_ratio, pack_trees, rhd, ring,
                           synthesize, tree)
from jaxcoll.synth.select import packings, plan_named
from jaxcoll.topology import Topology, preset

COLLECTIVES = ["all_gather", "reduce_scatter", "all_reduce"]


def test_bound_reproduces_te_ccl_two_box_dgx2():
    t = preset("te-ccl-dgx2", 2)
    x, cut = min_cut_ratio(t)
    assert x == Fraction(125, 31)  # an odd GPU: 31 blocks must enter through its 125 GB/s port
    size = 1 << 30
    algbw = size / lower_bound(t, "all_gather", size) / 1e9
    assert round(algbw, 2) == 129.03


def test_bound_on_a_switch_is_the_port_bandwidth():
    t = preset("dgx-h100")
    assert min_cut_ratio(t)[0] == Fraction(450, 7)
    s = 8e9
    assert lower_bound(t, "all_reduce", s) == pytest.approx(2 * lower_bound(t, "all_gather", s))


def test_bound_of_a_two_rank_one_way_pair_uses_each_direction():
    d = {"ranks": 2, "links": [{"src": 0, "dst": 1, "bandwidth_GBps": 1, "bidirectional": False},
                               {"src": 1, "dst": 0, "bandwidth_GBps": 3, "bidirectional": False}]}
    t = Topology.from_dict(d)
    assert min_cut_ratio(t)[0] == 1  # rank 0's block leaves at 1 GB/s


def test_packing_reaches_the_bound_before_rounding():
    for name, boxes in [("te-ccl-dgx2", 2), ("dgx-h100", 2), ("mi250", 1), ("dgx2", 1)]:
        t = preset(name, boxes)
        p = pack_trees(t)
        assert p.t_unit == pytest.approx(1 / (float(min_cut_ratio(t)[0]) * 1e9), rel=1e-6)
        # whole chunks: the rounding (largest remainder, then a local search) stays within 3% of the LP at 128 chunks
        assert p.time(128) <= p.t_unit * 1.03


def _inputs(coll, n, rng):
    per_rank = 4 * n * 7  # divisible into N blocks and uneven chunks
    return [rng.standard_normal(per_rank).astype(np.float32) for _ in range(n)]


def _reference(coll, xs):
    n = len(xs)
    if coll == "all_reduce":
        return [np.sum(xs, axis=0)] * n
    if coll == "all_gather":
        return [np.concatenate(xs)] * n
    total = np.sum(xs, axis=0).reshape(n, -1)
    return [total[r] for r in range(n)]


def _plans(t, coll, k=None):
    # the packing as the selection builds it (with headroom on dgx1's second routes), and the exact LP's
    out = [ring(t, coll, 2), forest(t, coll, k, packings(t)), forest(t, coll, 1)]
    if coll == "all_reduce":
        out.append(tree(t, coll, 2))
    if t.nranks & (t.nranks - 1) == 0:
        out.append(rhd(t, coll))
    if len(t.boxes) > 1:
        out.append(hierarchical(t, coll, 2))
    return out


@pytest.mark.parametrize("coll", COLLECTIVES)
@pytest.mark.parametrize("name, boxes", [("dgx1", 1), ("mi250", 1), ("dgx-a100", 2)])
def test_synthesized_plans_pass_the_proving_checker(name, boxes, coll):
    check = pytest.importorskip("jaxcoll.lang").check
    t = preset(name, boxes)
    for plan in _plans(t, coll):
        validate(plan)
        check(plan)


@pytest.mark.parametrize("coll", COLLECTIVES)
@pytest.mark.parametrize("name, boxes", [("dgx1", 1), ("dgx-h100", 2)])
def test_synthesized_plans_run_on_the_cpu_executor(name, boxes, coll):
    runtime = pytest.importorskip("jaxcoll.runtime")
    rng = np.random.default_rng(0)
    t = preset(name, boxes)
    for plan in _plans(t, coll, k=3):  # a few chunks per root keeps the executor's run short
        xs = _inputs(coll, t.nranks, rng)
        outs = runtime.run_plan(plan, xs, op="sum")
        for r, (got, want) in enumerate(zip(outs, _reference(coll, xs))):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{plan.name} rank {r}")


@pytest.mark.parametrize("coll", COLLECTIVES)
def test_plans_on_alternative_routes_pass_the_checker_and_run_on_the_cpu_executor(coll):
    # dgx1's packing puts tree edges on the PCIe path beside an NVLink (channel 1): the steps name the channel,
    # the checker's one lane per channel holds, and the CPU executor (which ignores channels) matches numpy.
    t = preset("dgx1")
    plan = forest(t, coll, 16)
    assert any(step.channel == 1 for _, _, _, step in plan.steps())
    validate(plan)
    check = pytest.importorskip("jaxcoll.lang").check
    check(plan)
    runtime = pytest.importorskip("jaxcoll.runtime")
    xs = _inputs(coll, t.nranks, np.random.default_rng(0))
    for r, (got, want) in enumerate(zip(runtime.run_plan(plan, xs, op="sum"), _reference(coll, xs))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{plan.name} rank {r}")


# Hybrid cube mesh, a switched box and the xGMI mesh (every candidate at three sizes: a few seconds each).
@pytest.mark.parametrize("name, boxes", [("dgx1", 1), ("dgx-h100", 1), ("mi250", 1)])
def test_all_reduce_is_never_slower_than_ring_or_tree(name, boxes):
    t = preset(name, boxes)
    for size in (1 << 10, 1 << 20, 1 << 30):
        plan = synthesize(t, "all_reduce", size)
        base = evaluate(t, "all_reduce", size, names=["ring", "tree1", "tree4", "tree16"])
        assert simulate(plan, t, size) <= min(c.seconds for c in base) * (1 + 1e-12)


@pytest.mark.parametrize("coll", COLLECTIVES)
def test_no_plan_beats_the_bound(coll):
    t = preset("dgx-h100", 2)
    size = 1 << 30
    for c in evaluate(t, coll, size):
        assert c.seconds >= lower_bound(t, coll, size) * (1 - 1e-9), c.name


def test_single_box_all_gather_reaches_the_bound():
    t = preset("dgx-h100")
    size = 1 << 30
    plan = synthesize(t, "all_gather", size)
    assert lower_bound(t, "all_gather", size) / simulate(plan, t, size) >= 0.99


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("name", ["dgx-h100", "dgx2"])
def test_forest_reaches_99_percent_of_the_bound_on_a_switched_box(name, coll):
    # reduce_scatter's in-trees are list-scheduled backwards in time (Schedule.list_schedule passes "bfb"), the
    # broadcasts forwards; both run within 1% of the max-flow bound at 1 GiB on a single switch
    t = preset(name)
    size = 1 << 30
    assert lower_bound(t, coll, size) / simulate(forest(t, coll), t, size) >= 0.99


def test_synthesize_rejects_other_collectives():
    with pytest.raises(ValueError, match="all_to_all"):
        synthesize(preset("dgx-h100"), Collective.ALL_TO_ALL, 1 << 20)


def test_the_selection_caches_per_topology_and_its_caches_go_with_the_topology():
    t = preset("dgx-h100", 1)
    first, _ = plan_named(t, "all_gather", "ring")
    again, _ = plan_named(t, "all_gather", "ring")
    assert again is first  # built once per topology
    assert plan_named(preset("dgx-h100", 1), "all_gather", "ring")[0] is not first  # a new topology, a new plan
    lower_bound(t, "all_reduce", 1 << 30)
    alive = weakref.ref(t)
    del t, first, again
    gc.collect()
    assert alive() is None  # nothing module-level keeps the topology, its packings or its plans
