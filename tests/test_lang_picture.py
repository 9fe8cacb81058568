"""`jaxcoll plan show/check/convert` and the picture and summary behind them."""

import json

import pytest

from jaxcoll.cli import main
from jaxcoll.lang.picture import rounds, summary, transfers
from test_lang_plans import MSCCL, example

RING_XML = str(MSCCL / "allreduce_ring_4.xml")


def test_summary_counts_steps_per_rank_and_bytes_per_link():
    from jaxcoll.lang import load_msccl_xml
    plan = load_msccl_xml(RING_XML)
    text = summary(plan, input_bytes=4096)
    assert "all_reduce over 4 ranks" in text
    # ring all-reduce: each link carries 2(N-1)/N of the input = 1.5x for N=4
    assert "0 -> 1: 6,144 (1.5x input)" in text
    assert set(transfers(plan, 1.0)) == {(0, 1), (1, 2), (2, 3), (3, 0)}


def test_rounds_put_dependent_hops_in_later_rounds():
    plan = example("ring_all_reduce").ring_all_reduce(4)
    when = rounds(plan)
    assert len(when) == sum(s.op.is_data for _, _, _, s in plan.steps())
    assert max(when.values()) >= 2 * (4 - 1) - 1  # a ring needs 2(N-1) hops one after another


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_plan_show_draws_and_summarises(tmp_path, capsys, suffix):
    out = tmp_path / f"ring.{suffix}"
    assert main(["plan", "show", RING_XML, "-o", str(out)]) == 0
    assert out.stat().st_size > 1000
    assert "bytes per link" in capsys.readouterr().out


def test_plan_check_and_convert(tmp_path, capsys):
    plan = example("all_pairs_all_reduce").all_pairs_all_reduce(3)
    path = tmp_path / "pairs.json"
    plan.save(path)
    assert main(["plan", "check", str(path)]) == 0
    assert "proved" in capsys.readouterr().out
    for name in ("pairs.xml", "pairs.mscclpp.json", "copy.json"):
        assert main(["plan", "convert", str(path), "-o", str(tmp_path / name)]) == 0
    assert json.loads((tmp_path / "pairs.mscclpp.json").read_text())["collective"] == "allreduce"
    assert main(["plan", "check", str(tmp_path / "pairs.xml")]) == 0


def test_plan_check_reports_a_wrong_plan(tmp_path, capsys):
    bad = tmp_path / "bad.xml"
    bad.write_text(open(RING_XML).read().replace('type="rrcs"', 'type="rcs"', 1))
    assert main(["plan", "check", str(bad)]) == 1
    assert "output chunk" in capsys.readouterr().err
