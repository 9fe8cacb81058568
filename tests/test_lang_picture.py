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
    assert "per link" in capsys.readouterr().out


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


def test_plan_show_of_a_missing_file_is_a_one_line_error(tmp_path, capsys):
    missing = tmp_path / "missing.json"
    assert main(["plan", "show", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"{missing}: No such file or directory"


def test_plan_show_of_a_file_that_is_no_json_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["plan", "show", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}: not a plan file") and err.count("\n") == 1


def test_plan_show_gives_traffic_in_multiples_of_the_input_unless_given_a_size(capsys):
    assert main(["plan", "show", RING_XML]) == 0
    out = capsys.readouterr().out
    assert "0 -> 1: 1.5x input" in out and "bytes per link" not in out
    assert main(["plan", "show", RING_XML, "--bytes", "64KiB"]) == 0
    out = capsys.readouterr().out
    assert "bytes per link for 65536 input bytes per rank" in out and "0 -> 1: 98,304 (1.5x input)" in out


def test_a_plan_of_many_steps_is_drawn_as_a_summary_picture(tmp_path, capsys, monkeypatch):
    from jaxcoll.lang import picture
    monkeypatch.setattr(picture, "DETAIL_STEPS", 4)
    out = tmp_path / "ring.png"
    assert main(["plan", "show", RING_XML, "-o", str(out)]) == 0
    assert "summary picture" in capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_small_plan_is_drawn_step_by_step(tmp_path):
    from jaxcoll.lang import load_msccl_xml
    from jaxcoll.lang.picture import draw
    assert draw(load_msccl_xml(RING_XML), tmp_path / "ring.svg") == "steps"


def test_plan_help_shows_defaults_and_examples(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "show", "--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and "jaxcoll plan show" in text and "--bytes" in text
