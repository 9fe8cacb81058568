"""`jaxcoll bench`: both program forms (a loop of calls below 1 MiB, one call per launch from 1 MiB up) build,
run and report a row per size with its spread, and the traffic it measures against is the closed form of each
collective; a busy machine is warned about."""

import os

import pytest

from jaxcoll.cli import main
from jaxcoll.cli.bench import MARKDOWN_ROW, copy_bandwidth_setting, min_traffic
from jaxcoll.cli.console import busy_machine


def test_bench_reports_a_row_per_size_for_loop_and_single_call_programs(tmp_path, capsys):
    md = tmp_path / "bench.md"
    assert main(["bench", "--collectives", "all_gather,reduce_scatter", "--sizes", "4K,1M", "--reps", "3",
                 "--warmup", "1", "--markdown", str(md)]) == 0
    text = md.read_text()
    for collective in ("all_gather", "reduce_scatter"):
        section = text.split(f"### {collective} ")[1].split("###")[0]
        rows = MARKDOWN_ROW.findall(section)
        assert [r[0] for r in rows] == ["4 KiB", "1 MiB"], section
        for _, *numbers in rows:
            ours, ours_lo, ours_hi, _, _, xla, xla_lo, xla_hi, _, speedup, pair_lo, pair_hi = map(float, numbers)
            assert 0 < ours_lo <= ours <= ours_hi and 0 < xla_lo <= xla <= xla_hi  # median within min-max
            assert abs(speedup - xla / ours) < 0.01 + 0.01 * speedup
            assert pair_lo <= pair_hi
    out = capsys.readouterr().out
    assert "reduce_scatter (jaxcoll algorithm=auto) vs XLA" in out
    assert f"wrote {md}" in out


def test_bench_warns_when_the_machine_is_busy(monkeypatch, capsys):
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    assert main(["bench", "--collectives", "all_reduce", "--sizes", "4K", "--reps", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert f"warning: the load average is 64.0 on {os.cpu_count()} cores" in out


def test_busy_machine_is_a_load_average_above_the_core_count(monkeypatch):
    cores = os.cpu_count()
    monkeypatch.setattr(os, "getloadavg", lambda: (cores + 0.5, 0.0, 0.0))
    assert "other work is running" in busy_machine()
    monkeypatch.setattr(os, "getloadavg", lambda: (cores - 0.5, 0.0, 0.0))
    assert busy_machine() is None


def test_busy_meanwhile_counts_other_processes_cpu_time_not_this_one_s(monkeypatch):
    from jaxcoll.cli import console
    cores = os.cpu_count()
    start = (0.0, 0.0, 0.0)
    # 10 s of wall time: the machine busy for 10 s on every core, all of it this process's own: no warning
    monkeypatch.setattr(console, "cpu_clock", lambda: (10.0, 10.0 * cores, 10.0 * cores))
    assert console.busy_meanwhile(start) is None
    # the same, with half of it other processes' time
    monkeypatch.setattr(console, "cpu_clock", lambda: (10.0, 10.0 * cores, 5.0 * cores))
    assert "other processes used 50%" in console.busy_meanwhile(start)
    assert console.busy_meanwhile(None) is None


def test_cpu_clock_reads_this_machine():
    from jaxcoll.cli.console import cpu_clock
    clock = cpu_clock()
    assert clock is None or all(v >= 0 for v in clock)


def test_bench_traffic_column_is_named_for_what_it_is_not_a_percentage(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    assert "traffic GB/s" in text and "% mem" not in text
    assert "(default: 7)" in text  # --reps
    assert "examples:" in text


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


def test_bench_times_each_algorithm_only_for_the_collectives_that_have_it(capsys):
    assert main(["bench", "--collectives", "all_reduce,all_gather", "--algorithms", "two_shot,ring",
                 "--sizes", "4K", "--reps", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "all_reduce (jaxcoll algorithm=two_shot) vs XLA" in out and "all_gather (jaxcoll algorithm=ring)" in out
    assert "all_gather: no algorithm two_shot (skipped)" in out
    assert "all_gather (jaxcoll algorithm=two_shot)" not in out


def test_bench_rejects_an_algorithm_no_collective_has_naming_it():
    with pytest.raises(SystemExit, match="--algorithms bogus is not an algorithm of all_gather"):
        main(["bench", "--collectives", "all_gather", "--algorithms", "bogus,ring", "--sizes", "4K"])


@pytest.mark.parametrize("value", ["fast", "0", "-3e9", "inf", "nan"])
def test_a_malformed_copy_bandwidth_setting_is_refused_naming_it(monkeypatch, value):
    monkeypatch.setenv("JAXCOLL_BENCH_COPY_BW", value)
    with pytest.raises(SystemExit, match=f"JAXCOLL_BENCH_COPY_BW={value!r} is not a bandwidth in bytes/s"):
        copy_bandwidth_setting()


def test_a_copy_bandwidth_setting_is_taken_as_given(monkeypatch):
    monkeypatch.setenv("JAXCOLL_BENCH_COPY_BW", "2.5e10")
    assert copy_bandwidth_setting() == 2.5e10
