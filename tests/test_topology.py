"""Topology: the file format, its errors, presets and the nvidia-smi parser."""

import json
import os

import pytest

from jaxcoll.topology import PRESETS, Topology, TopologyError, parse_nvidia_smi_topo, preset

DATA = os.path.join(os.path.dirname(__file__), "data", "topo")


def star(n=4, bw=10.0, lat=1.0):
    return {"name": "star", "ranks": n, "switches": ["sw"],
            "links": [{"src": r, "dst": "sw", "bandwidth_GBps": bw, "latency_us": lat} for r in range(n)]}


def test_json_round_trip_keeps_links_and_routes(tmp_path):
    t = Topology.from_dict(star())
    path = tmp_path / "t.json"
    t.save(path)
    u = Topology.load(path)
    assert u.capacities() == t.capacities()
    assert [u.links[i] for i in u.route(0, 3)] == [t.links[i] for i in t.route(0, 3)]
    assert u.path_latency_us(0, 3) == 2.0


def test_links_are_bidirectional_by_default_and_parallel_links_add():
    d = {"ranks": 2, "links": [{"src": 0, "dst": 1, "bandwidth_GBps": 12.5},
                               {"src": 0, "dst": 1, "bandwidth_GBps": 12.5}]}
    t = Topology.from_dict(d)
    assert t.capacity(0, 1) == 25 and t.capacity(1, 0) == 25


def test_one_way_link_is_one_way():
    d = {"ranks": 2, "links": [{"src": 0, "dst": 1, "bandwidth_GBps": 1, "bidirectional": False},
                               {"src": 1, "dst": 0, "bandwidth_GBps": 2, "bidirectional": False}]}
    t = Topology.from_dict(d)
    assert (t.capacity(0, 1), t.capacity(1, 0)) == (1, 2)


@pytest.mark.parametrize("bad, words", [
    ({"ranks": 2, "links": [{"src": 0, "dst": "nope", "bandwidth_GBps": 1}]}, ["link 0", "'nope'"]),
    ({"ranks": 2, "links": [{"src": 0, "dst": 1, "bandwidth_GBps": -3}]}, ["link 0", "bandwidth_GBps", "positive"]),
    ({"ranks": 3, "links": [{"src": 0, "dst": 1, "bandwidth_GBps": 1}]}, ["rank", "no path", "2"]),
    ({"ranks": 2, "links": [{"src": 0, "dst": 1, "bandwidth_GBps": 1, "bidirectional": False}]}, ["no path"]),
    ({"links": []}, ["ranks"]),
    ({"ranks": 2, "links": [{"src": 0, "dst": 1}]}, ["link 0", "bandwidth_GBps"]),
    ({"ranks": 2, "links": [{"src": 0, "dst": 1, "bandwidth_GBps": 1, "speed": 3}]}, ["link 0", "speed"]),
])
def test_bad_files_name_the_entry(bad, words):
    with pytest.raises(TopologyError) as e:
        Topology.from_dict(bad)
    for w in words:
        assert w in str(e.value)


def test_load_names_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"ranks": 2, "links": [{"src": 0, "dst": 9, "bandwidth_GBps": 1}]}))
    with pytest.raises(TopologyError, match="bad.json.*link 0"):
        Topology.load(path)


@pytest.mark.parametrize("name", sorted(set(PRESETS) - {"cpu", "te-ccl-dgx2"}))
@pytest.mark.parametrize("boxes", [1, 2, 4])
def test_presets_build_for_several_boxes(name, boxes):
    t = preset(name, boxes)
    per_box = {"dgx2": 16}.get(name, 8)
    assert t.nranks == per_box * boxes and len(t.boxes) == boxes
    assert Topology.from_dict(t.to_dict()).capacities() == t.capacities()


def test_preset_numbers_follow_their_sources():
    h = preset("dgx-h100", 2)
    sw = h.node_id("b0.nvswitch")
    assert h.capacity(0, sw) == 450  # 18 NVLink 4 links x 25 GB/s
    assert h.path_bandwidth_GBps(0, 8) == 50  # one NDR NIC per GPU on rail 0
    a = preset("dgx-a100")
    assert a.capacity(0, a.node_id("b0.nvswitch")) == 300
    d1 = preset("dgx1")
    assert sum(d1.capacity(0, v) for v in range(1, 8)) == 150  # 6 NVLink 2 links
    te = preset("te-ccl-dgx2", 2)
    assert te.capacity(1, 16) == 12.5 and te.capacity(16, 1) == 0  # odd of box 0 -> even of box 1


def test_unknown_preset_lists_known_ones():
    with pytest.raises(TopologyError, match="dgx-h100"):
        preset("dgx-z900")


def test_nvidia_smi_dgx1v_gives_the_cube_mesh():
    t = parse_nvidia_smi_topo(open(os.path.join(DATA, "dgx1v.txt")).read())
    assert t.nranks == 8
    ref = preset("dgx1")
    for a in range(8):
        for b in range(8):
            if a != b:
                assert t.capacity(a, b) == ref.capacity(a, b)  # NV1 = 25 GB/s, NV2 = 50 GB/s
    assert not t.capacity(0, 5) and t.direct(0, 5)  # no NVLink, but a PCIe / inter-socket path
    assert any(s.startswith("nic:mlx5_") for s in t.switches)


def test_nvidia_smi_two_gpus_over_a_host_bridge():
    t = parse_nvidia_smi_topo(open(os.path.join(DATA, "two_gpu_phb.txt")).read())
    assert t.nranks == 2 and t.direct(0, 1) and t.capacity(0, 1) == 0
    assert t.path_bandwidth_GBps(0, 1) == 16.0


def test_nvidia_smi_rejects_text_without_a_matrix():
    with pytest.raises(TopologyError, match="GPU0"):
        parse_nvidia_smi_topo("No devices were found")


def two_paths():
    """Ranks 0 and 1 joined by a fast switch (the route) and a slower one (the alternative)."""
    return Topology.from_dict({"name": "two-paths", "ranks": 2, "switches": ["fast", "slow"], "links": [
        {"src": r, "dst": "fast", "bandwidth_GBps": 10, "latency_us": 1.0} for r in (0, 1)] + [
        {"src": r, "dst": "slow", "bandwidth_GBps": 10, "latency_us": 1.5} for r in (0, 1)]})


def test_channel_1_is_the_fastest_path_sharing_no_link_with_the_route():
    t = two_paths()
    fast, slow = t.node_id("fast"), t.node_id("slow")
    assert t.route(0, 1) == t.route(0, 1, channel=0) == t.route(0, 1, channel=-1) == (
        t.link_index[0, fast], t.link_index[fast, 1])
    assert t.route(0, 1, channel=1) == (t.link_index[0, slow], t.link_index[slow, 1])
    assert t.channels(0, 1) == t.channels(1, 0) == 2
    assert t.path_latency_us(0, 1, channel=1) == 3.0
    with pytest.raises(TopologyError, match="channel 2"):
        t.route(0, 1, channel=2)


def test_a_pair_whose_paths_all_share_a_link_has_one_channel():
    t = preset("dgx-h100")  # one NVSwitch: every path from a GPU starts on its one port
    assert t.channels(0, 1) == 1
    with pytest.raises(TopologyError, match="no route on channel 1"):
        t.route(0, 1, channel=1)
