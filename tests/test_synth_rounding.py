"""The forest plan's whole chunks: rounding at 1024 chunks per block, pieces (contiguous chunk ranges) per tree,
determinism, and the rate it reaches against the independent max-flow bound."""

import pytest

from jaxcoll.plan import Buffer, Collective
from jaxcoll.sim import simulate
from jaxcoll.synth import forest, lower_bound, pack_trees
from jaxcoll.synth.packing import ROUNDING_CHUNKS, _pieces
from jaxcoll.synth.schedule import Schedule
from jaxcoll.topology import preset


def test_fine_rounding_is_within_a_fifth_of_a_percent_of_the_lp():
    p = pack_trees(preset("dgx-h100", 2))
    assert p.time(ROUNDING_CHUNKS) <= p.t_unit * 1.002


@pytest.mark.parametrize("second", [False, True])
def test_pieces_cover_each_tree_range_once(second):
    first = [("a", 500), ("b", 300), ("c", 224)]
    other = [("x", 100), ("y", 924)] if second else None
    pieces = _pieces(first, other, 1024, 64, taper=True)
    covered = sorted((start, count) for _, start, count, _, _ in pieces)
    at = 0
    for start, count in covered:
        assert start == at and count >= 1
        at += count
    assert at == 1024
    for name, size in first:
        assert sum(c for _, _, c, tree, _ in pieces if tree == name) == size
    if second:
        for name, size in other:
            assert sum(c for _, _, c, _, tree in pieces if tree == name) == size
    assert len(pieces) >= 64
    assert [w for w, *_ in pieces] == sorted(w for w, *_ in pieces)


def test_scratch_ranges_do_not_overlap():
    s = Schedule(Collective.REDUCE_SCATTER, 2, 8)
    taken = set()
    for position, count in [(0, 3), (2, 4), (1, 1), (0, 8), (5, 3)]:
        ref = s.scratch(1, position, count)
        assert ref.buffer is Buffer.SCRATCH and ref.count == count
        assert ref.index % 8 == position and ref.index % 8 + count <= 8  # one block, contiguous
        chunks = set(ref.indices())
        assert not chunks & taken
        taken |= chunks


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_forest_plan_is_the_same_on_every_build(coll):
    # the rounding has no time limit: two fresh topologies give the same plan, whatever the machine's load
    plans = [forest(preset("dgx-h100", 2), coll) for _ in range(2)]
    assert plans[0].to_json() == plans[1].to_json()


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("name, boxes", [("dgx-h100", 2), ("dgx-a100", 2), ("mi250", 1), ("mi250", 4), ("dgx1", 1),
                                         ("dgx-h100", 4)])
def test_forest_reaches_99_percent_of_the_bound(name, boxes, coll):
    t = preset(name, boxes)
    size = 1 << 30
    assert lower_bound(t, coll, size) / simulate(forest(t, coll), t, size) >= 0.99
