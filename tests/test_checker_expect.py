"""A custom plan's postcondition lives in its plan file (`Plan.expect`): the language fills it in, save/load
round-trips it, the wire form leaves it out, the checker proves a custom plan from its file alone (also
`jaxcoll plan check FILE`), and a wrong or malformed expect is a PlanError naming what is wrong."""

import json
import subprocess
import sys

import numpy as np
import pytest

from jaxcoll.lang import PlanError, check, chunk, program
from jaxcoll.lang.postcondition import value
from jaxcoll.plan import ZERO, Expect, Lane, Op, Plan, RankProgram, Step, decode, encode, validate
from jaxcoll.plan.ir import Buffer, ChunkRef

REPO = __import__("pathlib").Path(__file__).parent.parent


def all_to_next(n, k=2, instances=1):
    """Rank r's whole input to rank r+1 (MSCCLang's all-to-next); rank 0's output is unconstrained."""
    def post(r, i):
        return None if r == 0 else value([(r - 1, i)])
    with program("all_to_next", "custom", n, chunks=k, instances=instances, in_blocks=1, out_blocks=1,
                 postcondition=post) as p:
        for r in range(n - 1):
            chunk(r, "input", 0, k).copy(r + 1, "output", 0)
    return p.plan()


def test_program_states_its_postcondition_in_the_plan():
    plan = all_to_next(4)
    rows = plan.to_json()["expect"]["outputs"]
    assert rows == [[None, None]] + [[[[r - 1, i]] for i in range(2)] for r in range(1, 4)]
    assert plan.to_json()["expect"]["reduce_op"] == "sum"


def test_postcondition_follows_refined_chunks():
    plan = all_to_next(3, k=1, instances=2)  # chunk i of the program is chunks 2i, 2i+1 of the plan
    assert plan.chunk_factor == 2
    assert plan.expect.outputs[2] == (((1, 0),), ((1, 1),))


def test_custom_plan_is_proved_from_its_file_alone(tmp_path):
    plan = all_to_next(4)
    plan.save(tmp_path / "a2n.json")
    loaded = Plan.load(tmp_path / "a2n.json")
    assert loaded == plan and loaded.expect == plan.expect
    assert check(loaded) is loaded


def test_expect_is_not_in_the_wire_form():
    plan = all_to_next(4)
    bare = Plan(plan.collective, plan.nranks, plan.ranks, name=plan.name, in_blocks=1, out_blocks=1)
    np.testing.assert_array_equal(encode(plan), encode(bare))
    assert decode(encode(plan)).expect is None


def test_wrong_expect_in_the_file_is_rejected_with_rank_and_chunk(tmp_path):
    d = all_to_next(4).to_json()
    d["expect"]["outputs"][2][1] = [[0, 1]]  # claims rank 2 receives rank 0's chunk 1
    with pytest.raises(PlanError, match=r"rank 2: output chunk 1 holds r1.in\[1\], expected r0.in\[1\] for custom "
                                        r"\(missing r0.in\[1\]; extra r1.in\[1\]\)"):
        check(Plan.from_json(d))


def test_custom_plan_without_expect_states_no_postcondition():
    d = all_to_next(3).to_json()
    del d["expect"]
    with pytest.raises(PlanError, match="states no postcondition: give it an expect"):
        check(Plan.from_json(d))
    # an explicit postcondition still works, and takes precedence
    check(Plan.from_json(d), postcondition=lambda r, i: None if r == 0 else value([(r - 1, i)]))


def _reduce_twice():
    """Custom 2-rank plan: rank 1's output is in0 + in1 + in0 (rank 0's input reduced in twice)."""
    r = lambda rank, buf, i: ChunkRef(rank, buf, i)  # noqa: E731
    rank0 = RankProgram(1, 1, lanes=(Lane((Step(Op.PUT, (r(0, Buffer.INPUT, 0),), (r(1, Buffer.SCRATCH, 0),)),
                                           Step(Op.SIGNAL, peer=1, sem=0))),))
    rank1 = RankProgram(1, 1, 1, 1, (Lane((Step(Op.WAIT, sem=0), Step(
        Op.READ_REDUCE, (r(1, Buffer.SCRATCH, 0), r(1, Buffer.INPUT, 0), r(1, Buffer.SCRATCH, 0)),
        (r(1, Buffer.OUTPUT, 0),)))),))
    return rank0, rank1


@pytest.mark.parametrize("reduce_op,ok", [("sum", False), ("max", True), ("min", True)])
def test_reduce_op_decides_whether_a_duplicate_contribution_is_allowed(reduce_op, ok):
    rank0, rank1 = _reduce_twice()
    plan = Plan("custom", 2, (rank0, rank1), in_blocks=1, out_blocks=1,
                expect=Expect(((None,), (((0, 0), (1, 0)),)), reduce_op))
    if ok:
        check(plan)
    else:
        with pytest.raises(PlanError, match=r"holds 2x r0.in\[0\] \+ r1.in\[0\], expected r0.in\[0\] \+ "
                                            r"r1.in\[0\] for custom \(extra r0.in\[0\]\)"):
            check(plan)


def test_max_plan_with_a_duplicate_runs_for_max_and_is_refused_for_sum():
    runtime = pytest.importorskip("jaxcoll.runtime", exc_type=ImportError)
    rank0, rank1 = _reduce_twice()
    plan = check(Plan("custom", 2, (rank0, rank1), in_blocks=1, out_blocks=1,
                      expect=Expect(((None,), (((0, 0), (1, 0)),)), "max")))
    xs = [np.array([3.0, -1.0], np.float32), np.array([1.0, 5.0], np.float32)]
    np.testing.assert_array_equal(runtime.run_plan(plan, xs, op="max")[1], np.maximum(*xs))
    # under sum the plan would count rank 0 twice: the runtime refuses what the file's "max" forbids
    with pytest.raises(ValueError, match=r"stated for op='max'.*cannot run with op='sum'"):
        runtime.run_plan(plan, xs, op="sum")


def test_zero_contribution_round_trips():
    zero = Step(Op.ZERO, dsts=(ChunkRef(0, Buffer.OUTPUT, 0),))
    plan = Plan("custom", 1, (RankProgram(1, 1, lanes=(Lane((zero,)),)),), in_blocks=1, out_blocks=1,
                expect=Expect(((("zero",),),)))
    assert plan.expect.outputs == (((ZERO,),),)
    assert plan.to_json()["expect"]["outputs"] == [[["zero"]]]
    assert Plan.loads(plan.dumps()) == plan
    check(plan)


@pytest.mark.parametrize("edit,message", [
    (lambda e: e["outputs"].pop(), r"expect lists 3 ranks' outputs, the plan has nranks=4"),
    (lambda e: e["outputs"][1].pop(), r"expect: rank 1 lists 1 output chunks, its output holds 2"),
    (lambda e: e["outputs"][1].__setitem__(0, [[7, 0]]), r"rank 1, output chunk 0 names input chunk 0 of rank 7"),
    (lambda e: e["outputs"][1].__setitem__(0, [[0, 2]]), r"rank 1, output chunk 0 names input chunk 2 of rank 0"),
    (lambda e: e.__setitem__("reduce_op", "prod"), r"reduce_op='prod', expected one of"),
    (lambda e: e["outputs"][1].__setitem__(0, "zero"), r"an output chunk lists its contributions"),
    (lambda e: e["outputs"][1].__setitem__(0, [[0, 1, 2]]), r"a contribution is \[rank, input chunk\]"),
    (lambda e: e["outputs"][1].__setitem__(0, [3]), r"a contribution is \[rank, input chunk\]"),
])
def test_malformed_expect_is_a_plan_error(edit, message):
    d = all_to_next(4).to_json()
    edit(d["expect"])
    with pytest.raises(PlanError, match=message):
        validate(Plan.from_json(d))


def test_expect_only_belongs_to_custom_plans():
    prog = RankProgram(1, 1, lanes=(Lane((Step(Op.COPY, (ChunkRef(0, Buffer.INPUT, 0),),
                                               (ChunkRef(0, Buffer.OUTPUT, 0),)),)),))
    with pytest.raises(PlanError, match="expect is the postcondition of a custom plan"):
        Plan("all_reduce", 1, (prog,), expect=Expect(((((0, 0),),),)))
    with pytest.raises(PlanError, match="postcondition= is for custom programs"):
        program("p", "all_reduce", 2, postcondition=lambda r, i: None)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "jaxcoll", *args], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=300)


def test_cli_checks_a_custom_plan_file(tmp_path):
    path = tmp_path / "a2n.json"
    all_to_next(4).save(path)
    ok = _cli("plan", "check", str(path))
    assert ok.returncode == 0 and "proved (custom, 4 ranks" in ok.stdout
    d = json.loads(path.read_text())
    d["expect"]["outputs"][3][0] = [[1, 0]]
    path.write_text(json.dumps(d))
    bad = _cli("plan", "check", str(path))
    assert bad.returncode == 1 and "rank 3: output chunk 0 holds r2.in[0], expected r1.in[0]" in bad.stderr


@pytest.mark.parametrize("doc", ["docs/plan-ir.md", "docs/lang-tutorial.md"])
def test_expect_examples_in_the_docs_are_valid(doc):
    text = (REPO / doc).read_text()
    blocks = [b.split("```")[0] for b in text.split("```json\n")[1:]]
    found = [json.loads("{" + b + "}")["expect"] for b in blocks if b.lstrip().startswith('"expect"')]
    assert found
    for e in found:
        Expect.from_json(e)
    if doc.endswith("lang-tutorial.md"):  # the tutorial shows all_to_next's, over 4 ranks of one chunk
        assert Expect.from_json(found[0]) == all_to_next(4, k=1).expect
