"""`jaxcoll bench`: both program forms (a loop of calls below 1 MiB, one call per launch from 1 MiB up) build,
run and report a row per size, and the traffic it measures against is the closed form of each collective."""

import re

import pytest

from jaxcoll.cli import main
from jaxcoll.cli.bench import min_traffic


def test_bench_reports_a_row_per_size_for_loop_and_single_call_programs(tmp_path, capsys):
    md = tmp_path / "bench.md"
    assert main(["bench", "--collectives", "all_gather,reduce_scatter", "--sizes", "4K,1M", "--reps", "1",
                 "--markdown", str(md)]) == 0
    text = md.read_text()
    for collective in ("all_gather", "reduce_scatter"):
        section = text.split(f"### {collective} ")[1].split("###")[0]
        rows = re.findall(r"^\| (\d+ [KM]iB) \| ([\d.]+) \|.*\| ([\d.]+) \| [\d.]+ \| ([\d.]+)x \|$", section, re.M)
        assert [r[0] for r in rows] == ["4 KiB", "1 MiB"], section
        for _, ours, xla, speedup in rows:
            assert float(ours) > 0 and float(xla) > 0
            assert abs(float(speedup) - float(xla) / float(ours)) < 0.01 + 0.01 * float(speedup)
    assert "reduce_scatter (jaxcoll algorithm=auto) vs XLA" in capsys.readouterr().out


def test_min_traffic_is_every_input_read_and_every_output_written_once():
    n, s = 8, 1 << 20
    assert min_traffic("all_reduce", n, s) == 2 * n * s  # n inputs read, n outputs written
    assert min_traffic("all_gather", n, s) == n * s + n * (n * s)  # outputs are n times the input
    assert min_traffic("reduce_scatter", n, s) == n * s + n * (s // n)
    assert min_traffic("all_to_all", n, s) == 2 * n * s


def test_bench_rejects_a_negative_warmup_naming_the_value(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--warmup", "-1"])
    assert "--warmup: must be at least 0, got -1" in capsys.readouterr().err
