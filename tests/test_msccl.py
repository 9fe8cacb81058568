"""MSCCL XML import/export and MSCCL++ JSON export: imported algorithms are proved and run, round trips keep
the checked behaviour, and malformed files are a PlanError naming the element."""

import json

import numpy as np
import pytest

from jaxcoll.algorithms import BUILTINS, builtin
from jaxcoll.lang import PlanError, check, load_msccl_xml, to_msccl_xml, to_mscclpp_json
from jaxcoll.lang.check import execute, outputs
from jaxcoll.plan import Collective
from test_lang_plans import MSCCL, example_plans

FIXTURES = sorted(MSCCL.glob("*.xml"))


def same_behaviour(a, b):
    return outputs(a, execute(a)) == outputs(b, execute(b))


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixture_imports_and_is_proved(path):
    plan = check(load_msccl_xml(path))
    assert plan.nranks == int(path.stem.rsplit("_", 1)[1])
    assert check(load_msccl_xml(path.read_text())) == plan  # a path or the text


def test_in_place_ring_fixture_maps_tbs_to_lanes():
    plan = load_msccl_xml(MSCCL / "allreduce_ring_4.xml")
    assert plan.collective is Collective.ALL_REDUCE and plan.in_place
    assert [len(p.lanes) for p in plan.ranks] == [1, 1, 1, 1]


def test_imported_fixtures_run_on_the_executor():
    runtime = pytest.importorskip("jaxcoll.runtime", exc_type=ImportError)
    rng = np.random.default_rng(1)
    ar = load_msccl_xml(MSCCL / "allreduce_ring_4.xml")
    xs = [rng.integers(-9, 9, 23).astype(np.float32) for _ in range(4)]
    for got in runtime.run_plan(ar, xs):
        np.testing.assert_array_equal(got, np.sum(xs, axis=0))
    ag = load_msccl_xml(MSCCL / "allgather_ring_3.xml")
    xs = [rng.integers(-9, 9, 5).astype(np.float32) for _ in range(3)]
    for got in runtime.run_plan(ag, xs):
        np.testing.assert_array_equal(got, np.concatenate(xs))


def _round_trip_cases():
    cases = [(i, p) for i, p in example_plans() if p.collective is not Collective.CUSTOM]
    for c, d in BUILTINS.items():
        if c is Collective.PPERMUTE:
            continue  # zero steps have no MSCCL form
        for name in d:
            cases.append((f"{c.value}_{name}", builtin(c, name, 4, **({"root": 1} if c is Collective.BROADCAST
                                                                       else {}))))
    cases += [(p.stem, load_msccl_xml(p)) for p in FIXTURES]
    return cases


@pytest.mark.parametrize("name,plan", _round_trip_cases(), ids=[i for i, _ in _round_trip_cases()])
def test_plan_to_xml_to_plan_keeps_checked_behaviour(name, plan):
    back = check(load_msccl_xml(to_msccl_xml(plan)))
    assert (back.collective, back.nranks, back.in_place) == (plan.collective, plan.nranks, plan.in_place)
    assert same_behaviour(plan, back)


def test_round_trip_runs_on_the_executor():
    runtime = pytest.importorskip("jaxcoll.runtime", exc_type=ImportError)
    from test_lang_plans import example
    plan = load_msccl_xml(to_msccl_xml(example("hierarchical_all_reduce").hierarchical_all_reduce(2, 2)))
    xs = [np.arange(11, dtype=np.float32) * (r + 1) for r in range(4)]
    for got in runtime.run_plan(plan, xs):
        np.testing.assert_array_equal(got, np.sum(xs, axis=0))


GOOD_STEP = '<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>'


def algo(steps0=GOOD_STEP, steps1='<step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" '
         'depid="-1" deps="-1" hasdep="0"/>', coll="allreduce"):
    return (f'<algo name="t" coll="{coll}" ngpus="2" inplace="0" proto="Simple" nchannels="1" nchunksperloop="1">'
            f'<gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0"><tb id="0" send="1" recv="-1" chan="0">{steps0}'
            f'</tb></gpu><gpu id="1" i_chunks="1" o_chunks="1" s_chunks="0"><tb id="0" send="-1" recv="0" '
            f'chan="0">{steps1}</tb></gpu></algo>')


def test_a_well_formed_but_wrong_algorithm_is_caught_by_the_checker():
    plan = load_msccl_xml(algo())  # rank 1 gets rank 0's input, nobody sums: not an all-reduce
    with pytest.raises(PlanError, match="output chunk 0"):
        check(plan)


@pytest.mark.parametrize("text,match", [
    (algo(GOOD_STEP.replace('type="s"', 'type="xyz"')), r"<gpu id=0><tb id=0><step s=0>: unknown step type 'xyz'"),
    (algo(GOOD_STEP.replace('srcoff="0"', 'srcoff="5"')),
     r"<gpu id=0><tb id=0><step s=0>: src chunks 5..5 of the input buffer are out of range"),
    (algo(GOOD_STEP.replace('depid="-1" deps="-1"', 'depid="3" deps="0"')),
     r"<gpu id=0><tb id=0><step s=0>: depends on tb 3 step 0, which does not exist"),
    (algo(GOOD_STEP.replace('srcbuf="i"', 'srcbuf="q"')), r"<step s=0>: unknown buffer srcbuf='q'"),
    (algo(GOOD_STEP.replace('cnt="1"', 'cnt="x"')), r"<step s=0>: attribute cnt='x' is not an integer"),
    (algo(GOOD_STEP.replace('s="0"', 's="4"')), r"steps must be numbered 0, 1"),
    (algo(GOOD_STEP + GOOD_STEP.replace('s="0"', 's="1"')),
     r"<gpu id=0><tb id=0> sends 2 times to gpu 1 on channel 0, but <gpu id=1><tb id=0> receives 1 times"),
    (algo(coll="gossip"), r"<algo coll='gossip'>: unknown collective"),
    (algo(GOOD_STEP.replace('cnt="1"', 'cnt="0"')), r"<gpu id=0><tb id=0><step s=0>: attribute cnt=0 must be >= 1"),
    (algo(GOOD_STEP.replace('depid="-1" deps="-1"', 'depid="0,x" deps="0,1"')),
     r"<step s=0>: depid='0,x' deps='0,1' are not comma-separated integers"),
    (algo().replace('chan="0"', 'chan="-3"', 1), r"<gpu id=0><tb id=0>: attribute chan=-3 must be >= 0"),
    (algo().replace('send="1"', 'send="0"'), r"<gpu id=0><tb id=0>: peer 0 is the tb's own gpu"),
    (algo().replace('s_chunks="0"', 's_chunks="-4"', 1), r"<gpu id=0>: attribute s_chunks=-4 must be >= 0"),
    (algo().replace('inplace="0"', 'inplace="yes"'), r"<algo>: attribute inplace='yes', expected '0' or '1'"),
    (algo(coll="broadcast").replace('<algo ', '<algo root="2" '), r"<algo root=2>: root is out of range"),
    (algo(coll="ppermute").replace('<algo ', '<algo perm="0:1 1-0" '),
     r"<algo perm='0:1 1-0'>: '1-0' is not a pair source:destination"),
    (algo(coll="ppermute").replace('<algo ', '<algo perm="0:5" '), r"<algo perm='0:5'>: .* outside 0..1"),
    ('<algo coll="allreduce"></algo>', r"<algo ngpus=0>: an algorithm needs at least one <gpu>"),
    ("<algo><gpu", "not well formed"),
    ("<notalgo/>", "expected <algo>"),
])
def test_malformed_files_name_the_element(text, match):
    with pytest.raises(PlanError, match=match):
        load_msccl_xml(text)


def test_missing_file_is_a_plan_error(tmp_path):
    with pytest.raises(PlanError, match="cannot read"):
        load_msccl_xml(tmp_path / "absent.xml")


def test_mscclpp_json_has_the_executor_fields():
    from test_lang_plans import example
    plan = example("ring_all_reduce").ring_all_reduce(4, instances=2)
    doc = json.loads(to_mscclpp_json(plan))
    assert doc["collective"] == "allreduce" and doc["inplace"] is False
    assert len(doc["gpus"]) == 4
    g = doc["gpus"][0]
    assert (g["input_chunks"], g["output_chunks"]) == (plan.ranks[0].input_chunks, plan.ranks[0].output_chunks)
    assert len(g["threadblocks"]) == len(plan.ranks[0].lanes)
    names = {op["name"] for tb in g["threadblocks"] for op in tb["ops"]}
    assert {"signal", "wait"} <= names and names <= {"signal", "wait", "put", "rs", "rrcs", "rrc", "copy", "re",
                                                      "get", "sem_release", "sem_acquire", "barrier"}
    # every channel id an op uses exists, and every remote buffer names a peer
    nchan = len(g["channels"][0]["connected_to"])
    for tb in g["threadblocks"]:
        for op in tb["ops"]:
            assert all(0 <= c < nchan for c in op.get("channel_ids", []))
    assert all(b["rank"] != 0 for b in g["remote_buffers"])


def test_mscclpp_export_rejects_zero_steps():
    with pytest.raises(PlanError, match="zero step"):
        to_mscclpp_json(builtin(Collective.PPERMUTE, "direct", 3, perm=((0, 1),)))


def test_imported_in_place_ring_runs_through_jax_like_psum():
    jax = pytest.importorskip("jax")
    pytest.importorskip("jaxcoll.runtime", reason="the native runtime is not built", exc_type=ImportError)
    import jaxcoll
    from sharded import per_rank, put, sharded
    plan = check(load_msccl_xml(MSCCL / "allreduce_ring_4.xml"))
    x = np.arange(4 * 7 * 3, dtype=np.float32).reshape(4, 7, 3)  # 21 elements per rank: uneven chunks
    f = sharded(per_rank(lambda v: jaxcoll.all_reduce(v, "i", algorithm=plan)), "1d4")
    want = sharded(per_rank(lambda v: jax.lax.psum(v, "i")), "1d4")
    np.testing.assert_array_equal(np.asarray(f(put(x, "1d4"))), np.asarray(want(put(x, "1d4"))))
