"""The packing LP against the max-flow bound: equal on every preset. Where the bound counts a second path between
two ranks (a PCIe switch beside their NVLink or NVSwitch: dgx1, dgx2x2) the LP meets it with tree edges on the
pairs' alternative routes (channel 1); on one route per pair it is held to the cut of the routes, which is
computed here from `Topology.route` alone."""

from fractions import Fraction

import pytest

from jaxcoll.synth import min_cut_ratio, pack_trees
from jaxcoll.topology import Topology, preset

# Presets at 1, 2 and 4 boxes whose LP meets the bound; the 2-box ones (and dgx-h100x4, mi250x4) are in
# tests/test_synth_symmetry.py against the full LP too.
AT_BOUND = [("dgx-h100", 1), ("dgx-a100", 1), ("dgx-a100", 4), ("mi250", 1), ("dgx1", 4), ("dgx2", 1),
            ("dgx2", 4)]
# ... with channels only: the single-route optimum is below (the tests of the cut of the routes below)
AT_BOUND_WITH_CHANNELS = [("dgx1", 1), ("dgx2", 2)]


def bound(topology, inward=False):
    """The max-flow bound in seconds per byte of block."""
    return 1 / (float(min_cut_ratio(topology, reverse=inward)[0]) * 1e9)


def packed_at_the_bound(name, boxes, inward):
    """(topology, packing) of a preset, after checking that the packing LP's optimum is the max-flow bound."""
    t = preset(name, boxes)
    p = pack_trees(t, inward)
    assert p.t_unit == pytest.approx(bound(t, inward), rel=1e-9)
    return t, p


@pytest.mark.parametrize("inward", [False, True])
@pytest.mark.parametrize("name, boxes", AT_BOUND)
def test_packing_meets_the_max_flow_bound(name, boxes, inward):
    _, p = packed_at_the_bound(name, boxes, inward)
    assert all(c == 0 for _, _, c in p.pairs)  # on routes alone: no alternative joins the LP


@pytest.mark.parametrize("inward", [False, True])
@pytest.mark.parametrize("name, boxes", AT_BOUND_WITH_CHANNELS)
def test_packing_meets_the_max_flow_bound_with_the_pcie_path_beside_the_route(name, boxes, inward):
    t, p = packed_at_the_bound(name, boxes, inward)
    # the alternatives that join: a GPU pair's shared PCIe switch (dgx1: of NVLink pairs; dgx2x2: of every GPU pair
    # on one), 2 ordered pairs a switch
    alternatives = [(a, b) for a, b, c in p.pairs if c == 1]
    assert len(alternatives) == 2 * len([s for s in t.switches if ".pcie" in s])
    for a, b in alternatives:
        hops = [t.node_name(t.links[e].dst) for e in t.route(a, b, 1)]
        assert len(hops) == 2 and ".pcie" in hops[0]
        assert not set(t.route(a, b, 1)) & set(t.route(a, b))
    assert any(hasattr(parent, "channels") for trees in p.trees for parent, _ in trees)


def route_cut(topology, ranks, links, inward=False):
    """GB/s per block above which no packing of single-route tree edges runs: every rank of `ranks` receives the
    N-1 other blocks (reduce_scatter, `inward`: sends its share of them), each over a tree edge whose route
    crosses one of `links` (asserted for every rank pair with a route), so those links carry |ranks| (N-1)
    blocks."""
    n = topology.nranks
    cut = {topology.link_index[topology.node_id(a), topology.node_id(b)] for a, b in links}
    for v in ranks:
        for u in range(n):
            a, b = (v, u) if inward else (u, v)
            if u != v and topology.direct(a, b):
                assert cut.intersection(topology.route(a, b)), f"route {a} -> {b} avoids the cut"
    return sum(topology.capacity(topology.links[e].src, topology.links[e].dst) for e in cut) / (len(ranks) * (n - 1))


def ingress(topology, rank, inward=False):
    """Bandwidth into (reduce_scatter: out of) one rank, over all its links."""
    end = 0 if inward else 1
    return sum(c for pair, c in topology.capacities().items() if pair[end] == rank)


@pytest.mark.parametrize("inward", [False, True])
def test_dgx2x2_packing_on_routes_alone_meets_the_cut_of_its_routes(inward):
    # GPUs 0 and 1 share PCIe switch b0.pcie0 and NIC 0. The bound is rank 0's ingress, 31 blocks over NVSwitch
    # (150 GB/s) plus PCIe (16 GB/s), which needs GPU 1 -> pcie0 -> GPU 0 beside their NVSwitch route. Along
    # routes, the pair takes in 2 x 31 blocks over its NVSwitch ports and NIC 0's one rail port (12.5 GB/s).
    t = preset("dgx2", 2)
    assert min_cut_ratio(t, reverse=inward)[0] == ingress(t, 0, inward) / 31 == Fraction(166, 31)
    links = [("b0.nvswitch", 0), ("b0.nvswitch", 1), ("rail0", "b0.nic0")]
    x = route_cut(t, [0, 1], [(b, a) for a, b in links] if inward else links, inward)
    assert x == Fraction(625, 124)  # (300 + 12.5) / 62: 94.13% of the bound's 166/31
    assert pack_trees(t, inward, channels=False).t_unit == pytest.approx(1 / (float(x) * 1e9), rel=1e-9)


@pytest.mark.parametrize("inward", [False, True])
def test_dgx1_packing_on_routes_alone_meets_the_cut_of_its_routes(inward):
    # GPUs 0-3 (CPU 0's side) are NVLink-joined to each other; from GPUs 4-7 a route either is an NVLink or crosses
    # CPU 1 -> CPU 0 (19.2 GB/s). The bound, 166/7 (6 NVLinks and PCIe), needs PCIe paths beside NVLinks.
    t = preset("dgx1")
    assert min_cut_ratio(t, reverse=inward)[0] == ingress(t, 0, inward) / 7 == Fraction(166, 7)
    side = [0, 1, 2, 3]
    links = [(u, v) for v in side for u in range(8) if t.capacity(u, v)] + [("b0.cpu1", "b0.cpu0")]
    x = route_cut(t, side, [(b, a) for a, b in links] if inward else links, inward)
    assert x == Fraction(6192, 280)  # (4 x 150 + 19.2) / 28: 93.25% of the bound
    assert pack_trees(t, inward, channels=False).t_unit == pytest.approx(1 / (float(x) * 1e9), rel=1e-9)


@pytest.mark.parametrize("inward", [False, True])
@pytest.mark.parametrize("name, boxes", AT_BOUND_WITH_CHANNELS)
def test_headroom_packs_for_a_fraction_of_the_second_routes_links(name, boxes, inward):
    # With headroom h the packing is the optimum of the topology whose second-route links carry h of their
    # bandwidth: the max-flow bound of that topology, built here from the file format.
    t, h = preset(name, boxes), Fraction(9, 10)
    p = pack_trees(t, inward, headroom=float(h))
    second = {e for a, b, c in p.pairs if c == 1 for e in t.route(a, b, c)}
    assert second and all(".pcie" in t.node_name(t.links[e].src) + t.node_name(t.links[e].dst) for e in second)
    d = t.to_dict()
    for e, link in enumerate(d["links"]):
        assert (t.node_id(link["src"]), t.node_id(link["dst"])) == (t.links[e].src, t.links[e].dst)
        if e in second:
            link["bandwidth_GBps"] = Fraction(str(link["bandwidth_GBps"])) * h
    scaled = Topology.from_dict(d)
    assert p.t_unit == pytest.approx(bound(scaled, inward), rel=1e-9)
    assert bound(t, inward) < p.t_unit < bound(t, inward) / float(h)
    if name == "dgx2":  # still one rank's ingress: 31 blocks over NVSwitch (150 GB/s) and PCIe at h x 16 GB/s
        assert min_cut_ratio(scaled, reverse=inward)[0] == (150 + 16 * h) / 31
