"""The box-shift symmetry of the tree packing: on k identical boxes the LP solved for box 0's roots (one row per
orbit of links and pairs) has the optimum of the full LP, and its shifted trees are a packing of the full problem,
checked here from the trees and routes alone."""

import random

import numpy as np
import pytest

import jaxcoll.synth.packing as packing
from jaxcoll.sim.engine import max_min_rates
from jaxcoll.synth import min_cut_ratio, pack_trees
from jaxcoll.synth.symmetry import box_shift
from jaxcoll.topology import Topology, preset

# Presets whose full LP runs in about a second (not dgx2x2's, which needs alternative routes and tens of seconds;
# its symmetric packing is checked against the routes below).
SYMMETRIC = [("dgx-h100", 2), ("dgx-a100", 2), ("mi250", 2), ("dgx1", 2), ("te-ccl-dgx2", 2), ("dgx-h100", 4),
             ("mi250", 4)]


def full_lp(topology, inward=False, fair=True):
    """The packing LP over every root, with the symmetry turned off."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(packing, "box_shift", lambda t: None)
        return pack_trees(topology, inward, fair)


def bound(topology, inward=False):
    """The max-flow bound in seconds per byte of block."""
    return 1 / (float(min_cut_ratio(topology, reverse=inward)[0]) * 1e9)


def assert_packs(topology, p, fair=True):
    """Every root's trees span the ranks, its weights sum to 1, and the weighted trees keep every link within
    bandwidth x t_unit and (if `fair`) every pair within its max-min fair share x t_unit (loads summed from the
    routes)."""
    n = topology.nranks
    pairs = set(p.pairs)
    link_load = np.zeros(len(topology.links))
    pair_load = dict.fromkeys(p.pairs, 0.0)
    for r in range(n):
        assert sum(w for _, w in p.trees[r]) == pytest.approx(1.0, rel=1e-12)
        for parent, w in p.trees[r]:
            assert parent[r] == -1 and w > 0
            for v in range(n):
                hops, u = 0, v
                while u != r and hops <= n:
                    u, hops = parent[u], hops + 1
                assert u == r, f"rank {v} does not reach root {r}"
                if v != r:
                    a, b = (v, parent[v]) if p.inward else (parent[v], v)
                    c = parent.channels[v] if hasattr(parent, "channels") else 0
                    assert (a, b, c) in pairs
                    pair_load[a, b, c] += w
                    for e in topology.route(a, b, c):
                        link_load[e] += w
    seconds = p.t_unit * 1e9  # the loads are in blocks; bandwidths in GB/s
    bandwidth = np.array([l.bandwidth_GBps for l in topology.links])
    assert (link_load <= bandwidth * seconds * (1 + 1e-9)).all()
    if not fair:
        return
    share = max_min_rates([np.asarray(topology.route(a, b, c)) for a, b, c in p.pairs], bandwidth)
    assert (np.array([pair_load[q] for q in p.pairs]) <= share * seconds * (1 + 1e-9)).all()


@pytest.mark.parametrize("name, boxes", SYMMETRIC)
def test_symmetric_lp_has_the_optimum_of_the_full_lp(name, boxes):
    t = preset(name, boxes)
    assert box_shift(t) is not None
    p, full = pack_trees(t), full_lp(t)
    assert p.t_unit == pytest.approx(full.t_unit, rel=1e-9)
    assert full.t_unit == pytest.approx(bound(t), rel=1e-9)  # on these presets the LP meets the max-flow bound
    assert_packs(t, p)


def test_shifted_trees_keep_their_channels():
    # dgx2x2 meets the bound with tree edges on alternative routes (a GPU pair's PCIe switch): box 1's trees are
    # box 0's shifted, channels with them, and still a packing along the routes of those channels.
    t = preset("dgx2", 2)
    p = pack_trees(t)
    assert p.t_unit == pytest.approx(bound(t), rel=1e-9)
    assert any(hasattr(parent, "channels") for parent, _ in p.trees[16])
    assert_packs(t, p)


@pytest.mark.parametrize("inward", [False, True])
def test_reduce_scatter_packing_is_symmetric_too(inward):
    t = preset("dgx-a100", 2)
    p = pack_trees(t, inward)
    assert p.t_unit == pytest.approx(full_lp(t, inward).t_unit, rel=1e-9)
    assert_packs(t, p)


@pytest.mark.parametrize("name, boxes", [("dgx-h100", 4), ("dgx1", 2)])
def test_box_b_trees_are_box_0_trees_shifted_by_b(name, boxes):
    t = preset(name, boxes)
    p = pack_trees(t)
    n, per_box = t.nranks, t.nranks // boxes

    def shifted(parent, b):
        out = [-1] * n
        for v, u in enumerate(parent):
            out[(v + b * per_box) % n] = -1 if u < 0 else (u + b * per_box) % n
        return tuple(out)

    for r in range(per_box):
        for b in range(1, boxes):
            want = sorted((shifted(parent, b), w) for parent, w in p.trees[r])
            assert sorted(p.trees[r + b * per_box]) == want


def test_the_shift_maps_each_box_switch_to_its_twin_one_box_over():
    t = preset("dgx-h100", 32)
    shift = box_shift(t)
    name = t.node_name
    for v in range(t.num_nodes):
        image = name(int(shift.nodes[v]))
        if t.is_rank(v):
            assert int(image) == (v + 8) % 256
        elif name(v).startswith("b"):
            box, part = name(v)[1:].split(".")
            assert image == f"b{(int(box) + 1) % 32}.{part}"
        else:
            assert image == name(v)  # rails and the spine serve every box


def test_the_shift_is_found_without_switch_names():
    d = preset("dgx-a100", 2).to_dict()
    names = list(d["switches"])
    fresh = dict(zip(names, random.Random(0).sample([f"s{i}" for i in range(len(names))], len(names))))
    d["switches"] = [fresh[s] for s in names]
    for link in d["links"]:
        for end in ("src", "dst"):
            link[end] = fresh.get(link[end], link[end])
    t = Topology.from_dict(d)
    assert box_shift(t) is not None
    assert pack_trees(t).t_unit == pytest.approx(bound(t), rel=1e-9)


def test_a_topology_with_one_slower_link_falls_back_to_the_full_lp():
    d = preset("dgx-h100", 2).to_dict()
    link = next(l for l in d["links"] if l["src"] == 9 and l["dst"] == "b1.nic1")
    link["bandwidth_GBps"] = 40  # rank 9's PCIe link to its NIC: box 1 is no longer box 0 shifted
    t = Topology.from_dict(d)
    assert box_shift(t) is None
    p = pack_trees(t)
    assert p.t_unit == pytest.approx(full_lp(t).t_unit, rel=1e-9)
    assert p.t_unit >= bound(t) * (1 - 1e-9)
    assert_packs(t, p)


def test_a_link_that_the_shift_fixes_carries_the_trees_of_every_box():
    # Three boxes of two ranks; every transfer between boxes crosses the one link up -> down, which the shift maps
    # to itself: the symmetric LP must count it once per box (its orbit is 1 link, the shifts of a tree are 3).
    # Without pair capacities (fair=False): the fair shares of the pairs across it would bound it already.
    boxes, links = 3, [{"src": "up", "dst": "down", "bandwidth_GBps": 10, "bidirectional": False}]
    for b in range(boxes):
        links += [{"src": 2 * b + i, "dst": f"b{b}.sw", "bandwidth_GBps": 100} for i in range(2)]
        links += [{"src": f"b{b}.sw", "dst": "up", "bandwidth_GBps": 100, "bidirectional": False},
                  {"src": "down", "dst": f"b{b}.sw", "bandwidth_GBps": 100, "bidirectional": False}]
    t = Topology.from_dict({"name": "hub", "ranks": 2 * boxes, "switches": ["up", "down"] +
                            [f"b{b}.sw" for b in range(boxes)], "links": links,
                            "boxes": [[2 * b, 2 * b + 1] for b in range(boxes)]})
    shift = box_shift(t)
    assert shift is not None
    assert shift.links[t.link_index[t.node_id("up"), t.node_id("down")]] == t.link_index[t.node_id("up"),
                                                                                          t.node_id("down")]
    for inward, fair in [(False, False), (True, False), (False, True)]:
        p = pack_trees(t, inward, fair)
        assert p.t_unit == pytest.approx(full_lp(t, inward, fair).t_unit, rel=1e-9)
        assert_packs(t, p, fair)


def test_single_boxes_have_no_shift():
    assert box_shift(preset("dgx-h100")) is None
    assert box_shift(preset("mi250")) is None
