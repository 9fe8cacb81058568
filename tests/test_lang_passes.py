"""Each compiler pass on its own: what it must produce for small instruction lists."""

import types

from jaxcoll.lang.compiler import (Instr, assign_lanes, dependencies, drop_dead_writes, fuse, insert_sync,
                                   layout_scratch, pipeline, replicate)
from jaxcoll.lang.named_scratch import placeholder
from jaxcoll.plan import Buffer, ChunkRef, Collective, Op, Step

IN, OUT, SCR = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
SPACE = types.SimpleNamespace(collective=Collective.ALL_REDUCE, in_place=False, chunk_factor=2)


def ref(r, b, i, c=1):
    return ChunkRef(r, b, i, c)


def put(a, b, rank=None):
    return Instr(a.rank if rank is None else rank, Step(Op.PUT if a.rank != b.rank else Op.COPY, (a,), (b,)))


def reduce_at(dst, src):
    op = Op.REDUCE if dst.rank == src.rank else Op.READ_REDUCE
    return Instr(dst.rank, Step(op, (dst, src), (dst,)))


def test_dependencies_follow_reads_after_writes_and_writes_after_reads():
    prog = [put(ref(0, IN, 0), ref(1, SCR, 0)),       # 0 writes r1.s0
            reduce_at(ref(1, OUT, 0), ref(1, SCR, 0)),  # 1 reads r1.s0 (after 0), reads/writes r1.o0
            put(ref(0, IN, 1), ref(1, SCR, 0)),         # 2 overwrites r1.s0: after 0 (ww) and 1 (wr)
            put(ref(0, IN, 1), ref(1, OUT, 1))]         # 3 independent
    assert dependencies(prog, SPACE) == [set(), {0}, {0, 1}, set()]


def test_dependencies_see_in_place_aliasing():
    space = types.SimpleNamespace(collective=Collective.ALL_REDUCE, in_place=True, chunk_factor=1)
    prog = [put(ref(0, OUT, 0), ref(1, SCR, 0)), Instr(0, Step(Op.COPY, (ref(0, SCR, 0),), (ref(0, IN, 0),)))]
    assert dependencies(prog, space) == [set(), {0}]  # input 0 is output 0 in place


def test_fuse_reduce_then_put_into_reduce_put():
    prog = [reduce_at(ref(1, SCR, 0), ref(1, IN, 0)), put(ref(1, SCR, 0), ref(2, SCR, 0))]
    out, deps = fuse(prog, dependencies(prog, SPACE))
    assert len(out) == 1 and out[0].step.op is Op.REDUCE_PUT
    assert out[0].step.dsts == (ref(1, SCR, 0), ref(2, SCR, 0)) and deps == [set()]


def test_fuse_read_reduce_then_put_into_read_reduce_put():
    prog = [reduce_at(ref(1, SCR, 0), ref(0, IN, 0)), put(ref(1, SCR, 0), ref(2, OUT, 0))]
    out, _ = fuse(prog, dependencies(prog, SPACE))
    assert [i.step.op for i in out] == [Op.READ_REDUCE_PUT]


def test_fuse_get_then_put_is_receive_copy_send():
    get = Instr(1, Step(Op.GET, (ref(0, IN, 0),), (ref(1, OUT, 0),)))
    prog = [get, put(ref(1, OUT, 0), ref(2, OUT, 0))]
    out, _ = fuse(prog, dependencies(prog, SPACE))
    assert [i.step.op for i in out] == [Op.READ_REDUCE_PUT]
    assert out[0].step.srcs == (ref(0, IN, 0),) and out[0].step.dsts == (ref(1, OUT, 0), ref(2, OUT, 0))


def test_fuse_keeps_steps_apart_when_the_put_waits_on_something_later():
    prog = [reduce_at(ref(1, SCR, 0), ref(1, IN, 0)),
            put(ref(0, IN, 0), ref(2, OUT, 0)),          # writes r2.o0 ...
            Instr(2, Step(Op.COPY, (ref(2, OUT, 0),), (ref(2, SCR, 0),))),  # ... read here
            put(ref(1, SCR, 0), ref(2, OUT, 0))]          # overwrites r2.o0: must follow instr 2
    out, _ = fuse(prog, dependencies(prog, SPACE))
    assert len(out) == 4


def test_fuse_renumbers_dependencies_of_later_steps():
    prog = [reduce_at(ref(1, SCR, 0), ref(1, IN, 0)), put(ref(1, SCR, 0), ref(2, SCR, 0)),
            reduce_at(ref(2, OUT, 0), ref(2, SCR, 0))]
    out, deps = fuse(prog, dependencies(prog, SPACE))
    assert len(out) == 2 and deps[1] == {0}


def test_assign_lanes_one_lane_per_peer_set_and_instance():
    prog = [put(ref(0, IN, 0), ref(1, OUT, 0)), put(ref(0, IN, 0), ref(2, OUT, 0)),
            put(ref(0, IN, 1), ref(1, OUT, 1)), Instr(0, Step(Op.COPY, (ref(0, IN, 0),), (ref(0, OUT, 0),)), lane=7)]
    lanes = [i.lane for i in assign_lanes(prog)]
    assert lanes == [0, 1, 0, 7]
    assert [i.lane for i in assign_lanes(prog, max_lanes=1)] == [0, 0, 0, 7]


def test_insert_sync_signals_after_and_waits_before_each_cross_lane_dependency():
    prog = assign_lanes([put(ref(0, IN, 0), ref(1, SCR, 0)), reduce_at(ref(1, OUT, 0), ref(1, SCR, 0))])
    # reduce_at on rank 1 reads rank 1 only: it is a local reduce of what rank 0 put there
    lanes, sems = insert_sync(prog, dependencies(prog, SPACE), SPACE, 2)
    assert [s.op for s in lanes[0][0]] == [Op.PUT, Op.SIGNAL]
    assert lanes[0][0][1].peer == 1 and lanes[0][0][1].sem == 0
    assert [s.op for s in lanes[1][0]] == [Op.WAIT, Op.REDUCE]
    assert sems == [0, 1]


def test_insert_sync_counts_waits_on_one_semaphore_per_lane_pair():
    prog = assign_lanes([put(ref(0, IN, 0), ref(1, SCR, 0)), put(ref(0, IN, 1), ref(1, SCR, 1)),
                         reduce_at(ref(1, OUT, 1), ref(1, SCR, 1))])
    lanes, _ = insert_sync(prog, dependencies(prog, SPACE), SPACE, 2)
    assert [s.op for s in lanes[0][0]] == [Op.PUT, Op.PUT, Op.SIGNAL]  # only the needed put signals
    assert [s.op for s in lanes[1][0]] == [Op.WAIT, Op.REDUCE]


def test_layout_scratch_places_named_buffers_at_block_boundaries():
    prog = [put(ref(0, IN, 1), ref(1, SCR, 1)), put(ref(0, IN, 1), ref(1, SCR, placeholder(0, 1))),
            put(ref(0, IN, 0), ref(1, SCR, placeholder(1, 0)))]
    out, size = layout_scratch(prog, 2, [2, 1])
    assert [i.step.dsts[0].index for i in out] == [1, 3, 4]
    assert size == 6


def test_replicate_gives_each_instance_its_piece():
    out = replicate([put(ref(0, IN, 1), ref(1, OUT, 1))], 2)
    assert [(i.instance, i.step.srcs[0].index) for i in out] == [(0, 2), (1, 3)]


def test_pipeline_splits_into_single_chunk_steps_in_order():
    out = pipeline([put(ref(0, IN, 0, 2), ref(1, OUT, 0, 2))], 2)
    assert [(i.step.srcs[0].index, i.step.srcs[0].count) for i in out] == [(0, 1), (1, 1), (2, 1), (3, 1)]


def test_drop_dead_writes_removes_scratch_results_nobody_reads():
    prog = [reduce_at(ref(1, SCR, 0), ref(1, IN, 0)), put(ref(1, SCR, 0), ref(2, SCR, 0)),
            reduce_at(ref(2, OUT, 0), ref(2, SCR, 0))]
    fused, _ = fuse(prog, dependencies(prog, SPACE))
    out = drop_dead_writes(fused, SPACE)
    assert out[0].step.dsts == (ref(2, SCR, 0),)  # r1.s0 was only the fused intermediate
    assert out[1].step == fused[1].step


def test_drop_dead_writes_keeps_scratch_read_later():
    prog = [Instr(1, Step(Op.REDUCE, (ref(1, SCR, 0), ref(1, IN, 0)), (ref(1, SCR, 0), ref(1, OUT, 0)))),
            put(ref(1, SCR, 0), ref(2, SCR, 0))]
    assert drop_dead_writes(prog, SPACE) == prog
