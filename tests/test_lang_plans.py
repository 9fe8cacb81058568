"""Plans shared by the language and checker tests: the examples, imported fixtures, and small builders."""

import importlib.util
import pathlib

from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step

ROOT = pathlib.Path(__file__).resolve().parents[1]
MSCCL = ROOT / "tests" / "data" / "msccl"
IN, OUT, SCR = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH


def example(name: str):
    """The module examples/lang/<name>.py."""
    spec = importlib.util.spec_from_file_location(f"lang_example_{name}", ROOT / "examples" / "lang" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def example_plans():
    """(id, plan, postcondition) for every example program at a few sizes."""
    ring = example("ring_all_reduce").ring_all_reduce
    pairs = example("all_pairs_all_reduce").all_pairs_all_reduce
    hier = example("hierarchical_all_reduce").hierarchical_all_reduce
    a2a = example("two_step_all_to_all").two_step_all_to_all
    nxt = example("all_to_next")
    out = []
    for n in (2, 3, 4, 8):
        out.append((f"ring{n}", ring(n)))
        out.append((f"all_pairs{n}", pairs(n)))
    out += [("ring4_inst2", ring(4, instances=2)), ("ring3_pipe2", ring(3, pipeline=2)),
            ("all_pairs4_inst2", pairs(4, instances=2)), ("hier2x2", hier(2, 2)), ("hier2x4", hier(2, 4)),
            ("hier4x2", hier(4, 2)), ("a2a2x2", a2a(2, 2)), ("a2a2x4", a2a(2, 4)), ("a2a4x2", a2a(4, 2)),
            ("next2x2", nxt.all_to_next(2, 2)), ("next3x2", nxt.all_to_next(3, 2))]
    return out


def lane(*steps):
    return Lane(tuple(steps))


def put(src, dst):
    return Step(Op.PUT, (src,), (dst,))


def signal(peer, sem=0):
    return Step(Op.SIGNAL, peer=peer, sem=sem)


def wait(sem=0):
    return Step(Op.WAIT, sem=sem)


def ref(rank, buf, index, count=1):
    return ChunkRef(rank, buf, index, count)


def two_rank_all_gather():
    """All-gather on 2 ranks where rank 1 forwards rank 0's chunk from its own output: needs a signal."""
    r0 = RankProgram(1, 2, semaphores=1, lanes=(lane(
        Step(Op.COPY, (ref(0, IN, 0),), (ref(0, OUT, 0),)),
        put(ref(0, IN, 0), ref(1, OUT, 0)), signal(1), wait()),))
    r1 = RankProgram(1, 2, semaphores=1, lanes=(lane(
        Step(Op.COPY, (ref(1, IN, 0),), (ref(1, OUT, 1),)), wait(),
        Step(Op.PUT, (ref(1, IN, 0),), (ref(0, OUT, 1),)), signal(0)),))
    return Plan(Collective.ALL_GATHER, 2, (r0, r1), name="ag2")
