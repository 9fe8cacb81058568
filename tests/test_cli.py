"""The `jaxcoll` command's help and messages: every option says its default, every command shows an example,
`synth` lists every topology preset it accepts, and a plan it writes comes with the command that shows it at the
size it was synthesized for."""

import pytest

from jaxcoll.cli import main
from jaxcoll.topology.presets import PRESETS


def help_text(capsys, *command) -> str:
    with pytest.raises(SystemExit) as e:
        main([*command, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_synth_help_names_every_preset_and_the_defaults(capsys):
    text = " ".join(help_text(capsys, "synth").split())  # argparse wraps lines
    for name in PRESETS:
        assert name in text, name
    assert "(default: all_reduce)" in text and "(default: 1GiB)" in text and "(default: 1)" in text
    assert "--boxes BOXES boxes of the preset" in text
    assert "examples: jaxcoll synth --topology" in text


@pytest.mark.parametrize("command", [("bench",), ("synth",), ("plan",), ("plan", "show")])
def test_every_command_shows_an_example(capsys, command):
    assert "examples:" in help_text(capsys, *command)


def test_synth_writes_a_plan_and_says_how_to_show_it_at_its_size(tmp_path, capsys):
    out = tmp_path / "ag.json"
    assert main(["synth", "--topology", "dgx1", "--collective", "all_gather", "--size", "64KiB",
                 "--out", str(out)]) == 0
    assert f"wrote {out}; see it with: jaxcoll plan show {out} --bytes 64KiB" in capsys.readouterr().out
    assert main(["plan", "show", str(out), "--bytes", "64KiB"]) == 0
    assert "bytes per link for 65536 input bytes per rank" in capsys.readouterr().out


def test_synth_of_an_unknown_preset_is_a_one_line_error(capsys):
    assert main(["synth", "--topology", "dgx9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxcoll synth: unknown topology preset 'dgx9'") and err.count("\n") == 1


def test_with_progress_returns_the_work_s_value_and_raises_its_error():
    import time

    from jaxcoll.cli.console import with_progress
    assert with_progress(lambda: 3, "quick") == 3
    assert with_progress(lambda: time.sleep(0.05) or 4, "slow", after_s=0.01) == 4  # the spinner's path
    with pytest.raises(ZeroDivisionError):
        with_progress(lambda: 1 / 0, "failing")
