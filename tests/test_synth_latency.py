"""The latency-aware end of synthesis: direct (star) plans and the choice of chunk count by message size."""

import math

import numpy as np
import pytest

from jaxcoll.plan import validate
from jaxcoll.sim import simulate
from jaxcoll.synth import direct, evaluate
from jaxcoll.topology import Topology, preset

COLLECTIVES = ["all_gather", "reduce_scatter", "all_reduce"]
B = 10.0  # GB/s per switch port
ALPHA_US = 2.0  # rank -> switch -> rank


def star(n):
    return Topology.from_dict({"name": f"star{n}", "ranks": n, "switches": ["sw"], "links": [
        {"src": r, "dst": "sw", "bandwidth_GBps": B, "latency_us": ALPHA_US / 2} for r in range(n)]})


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("size", [1e3, 1e9])
def test_direct_matches_its_closed_form(n, size):
    # Every rank sends its n-1 pieces at once through its one port: one hop latency, (n-1)/n S/B per phase.
    t = star(n)
    phase = ALPHA_US * 1e-6 + (n - 1) / n * size / (B * 1e9)
    assert math.isclose(simulate(direct(t, "all_gather"), t, size), phase, rel_tol=1e-9)
    assert math.isclose(simulate(direct(t, "reduce_scatter"), t, size), phase, rel_tol=1e-9)
    assert math.isclose(simulate(direct(t, "all_reduce"), t, size), 2 * phase, rel_tol=1e-9)


@pytest.mark.parametrize("coll", COLLECTIVES)
def test_direct_plans_pass_the_checker_and_run_on_the_cpu_executor(coll):
    check = pytest.importorskip("jaxcoll.lang").check
    runtime = pytest.importorskip("jaxcoll.runtime")
    t = preset("dgx-h100", 2)
    plan = validate(direct(t, coll))
    check(plan)
    n = t.nranks
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(n * 3 if coll != "all_gather" else 3).astype(np.float32) for _ in range(n)]
    if coll == "all_gather":
        want = [np.concatenate(xs)] * n
    elif coll == "reduce_scatter":
        total = np.sum(xs, axis=0).reshape(n, -1)
        want = [total[r] for r in range(n)]
    else:
        want = [np.sum(xs, axis=0)] * n
    for r, (got, w) in enumerate(zip(runtime.run_plan(plan, xs, op="sum"), want)):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5, err_msg=f"rank {r}")


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_small_messages_take_one_hop_and_medium_ones_a_few_chunks(coll):
    # dgx-h100 x2: at 1 KiB the latency terms decide and the star's single hop beats ring (N-1 hops) and
    # recursive halving/doubling (log2 N); at 256 MiB the packing pipelined over few chunks beats both the
    # one-chunk packing (no pipelining across its two hops) and the ring.
    # (The throughput packing is left out: simulating its 30k moves at three sizes costs seconds for nothing.)
    t = preset("dgx-h100", 2)
    names = ["ring", "rhd", "hierarchical", "direct", "forest1", "forest4", "forest16"]
    by = {c.name: c.seconds for c in evaluate(t, coll, 1 << 10, names)}
    assert by["direct"] == min(by.values())
    by = {c.name: c.seconds for c in evaluate(t, coll, 256 << 20, names)}
    assert min(by["forest4"], by["forest16"]) < min(by["forest1"], by["ring"], by["hierarchical"])
