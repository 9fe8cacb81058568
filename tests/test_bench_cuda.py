"""benchmarks/cuda.py without a GPU: its arguments, and the tables it prints from a timing source that gives known
numbers (the fused part's programs are built and run once on the CPU device): every goal column follows from
those numbers by the issue's thresholds."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxcoll import runtime

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_cuda", ROOT / "benchmarks" / "cuda.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = load_bench()
GB = 1e9


class FakeTimer:
    """Known times: a copy of 1000 GB/s; each bulk plan's traffic at a set share of the copy's 2000 GB/s of
    traffic; the packet protocol `packet_s` back to back and a failed graph capture; the fused ops at FUSED_SHARE
    of the dot, in the order the rows come (for each op, chunks 1 then 2, each as lowered then forced)."""

    device = jax.devices("cpu")[0]
    BULK_SHARE = {("all_reduce", 0): 0.9, ("all_reduce", 1): 0.8, ("all_gather", 0): 0.85, ("all_gather", 1): 0.5}
    FUSED_SHARE = (0.95, 0.6, 0.6, 0.95)  # per rounds() call, in turn

    def __init__(self, packet_s=8e-6):
        self.packet_s = packet_s
        self.calls = []
        self.variants = []

    def name(self):
        return "Fake GPU"

    def copy_bandwidth(self, nbytes, iters):
        self.calls.append(("copy", nbytes, iters))
        return 1000 * GB

    def plan(self, plan, input_elements, output_elements, *, iters, graph, protocol, blocks=0, poll="", scope=""):
        self.calls.append((plan.collective.value, input_elements, output_elements, iters, graph, protocol))
        if protocol == "ll":
            self.variants.append((plan.collective.value, plan.nranks, blocks, poll, scope))
            if graph:
                raise RuntimeError("cudaStreamEndCapture | not permitted\nhere")
            return {"seconds_per_call": self.packet_s, "protocol": "ll", "blocks_per_lane": blocks or 4,
                    "traffic_bytes": 1}
        nth = sum(1 for c in self.calls if c[0] == plan.collective.value) - 1  # the first or second algorithm
        traffic = 3 * input_elements * 4
        return {"seconds_per_call": traffic / (self.BULK_SHARE[plan.collective.value, nth] * 2000 * GB),
                "protocol": "bulk", "blocks_per_lane": 4, "traffic_bytes": traffic}

    def rounds(self, fns, args, rounds):
        for f in fns.values():  # the programs run: built for the CPU device, at --quick's shapes
            jax.block_until_ready(f(*args))
        share = self.FUSED_SHARE[sum(1 for c in self.calls if c[0] == "rounds") % len(self.FUSED_SHARE)]
        self.calls.append(("rounds", tuple(sorted(fns)), rounds))
        return {"dot": np.full(rounds, 1e-3), "fused": np.full(rounds, 1e-3 / share)}


def tables(out: str) -> dict[str, list[list[str]]]:
    """The markdown table rows (cells) under each '#### part' heading."""
    parts = {}
    for section in out.split("#### ")[1:]:
        name, _, body = section.partition("\n")
        rows = [line for line in body.splitlines() if line.startswith("|")]
        parts[name.strip()] = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows[2:]]
    return parts


@pytest.fixture
def single_rank_restored(monkeypatch):
    from jaxcoll.lowering import custom_call
    monkeypatch.setattr(custom_call, "lower_single_rank_groups", custom_call.lower_single_rank_groups)


def run_main(capsys, argv, timer):
    bench.main(argv, timer=timer)
    return capsys.readouterr().out


def test_bulk_rows_report_the_share_of_the_copy_and_the_85_percent_goal(capsys):
    timer = FakeTimer()
    out = run_main(capsys, ["--parts", "bulk", "--iters", "3"], timer)
    assert "1000.0 GB/s copied (2000.0 GB/s of traffic)" in out
    rows = tables(out)["bulk"]
    assert [(r[0], r[1]) for r in rows] == [("all_reduce", "two_shot"), ("all_reduce", "ring"),
                                           ("all_gather", "direct"), ("all_gather", "ring")]
    assert [r[7] for r in rows] == ["90%", "80%", "85%", "50%"]
    assert [r[8] for r in rows] == ["met", "**missed**", "met", "**missed**"]
    # The issue's sizes: 256 MiB in and out for all_reduce, 32 MiB in and 256 MiB out for an 8-rank all_gather.
    assert rows[0][3] == "256 MiB in, 256 MiB out" and rows[2][3] == "32 MiB in, 256 MiB out"
    assert ("copy", 256 << 20, 3) in timer.calls
    assert all(c[3] == 3 and c[5] == "bulk" for c in timer.calls if c[0] in ("all_reduce", "all_gather"))


def test_packet_rows_time_the_issues_sizes_and_report_a_failed_graph(capsys):
    timer = FakeTimer(packet_s=6e-6)
    out = run_main(capsys, ["--parts", "packet", "--ranks", "8"], timer)
    rows = tables(out)["packet"]
    goals = rows[:6]
    assert [(r[0], r[1], r[2], r[3]) for r in goals] == [
        ("all_reduce", "direct", "8", "8 KiB"), ("all_reduce", "direct", "2", "8 KiB"),
        ("all_reduce", "direct", "8", "64 KiB"), ("all_gather", "direct", "8", "1 KiB in, 8 KiB out"),
        ("reduce_scatter", "direct", "8", "8 KiB in, 1 KiB out"), ("all_reduce", "ring", "8", "8 KiB")]
    # 6 us back to back: within the 8-rank all_reduce's 7 us; the graph capture failed, and says so.
    assert goals[0][4] == "4" and goals[0][5] == "6.0 us" and goals[0][6] == "<= 7 us: met"
    assert goals[0][7].startswith("failed: cudaStreamEndCapture") and goals[0][8] == "-"
    assert all(len(r) == 9 for r in goals)  # the error's | and newline do not break the table
    assert goals[5][6] == goals[5][8] == "-"  # the ring has no goal
    calls = [c for c in timer.calls if c[-1] == "ll"]
    assert (2048, 2048) in {(c[1], c[2]) for c in calls} and all(c[3] >= 200 for c in calls)  # many calls
    # Then the variants, each of blocks, scope and polls, on the 8-rank 8 KiB all_reduce.
    assert rows[6][0] == "blocks per lane"  # the second table's header
    variants = rows[8:]
    assert len(variants) == 16
    assert {(c[2], c[3], c[4]) for c in timer.variants if c[2]} == {
        (b, poll, scope) for b in (1, 2, 4, 8) for poll in ("in_order", "in_flight")
        for scope in ("system", "narrowest")}
    assert all(c[0] == "all_reduce" and c[1] == 8 for c in timer.variants if c[2])


def test_fused_rows_compare_each_op_with_one_plain_dot(capsys, single_rank_restored):
    timer = FakeTimer()
    out = run_main(capsys, ["--parts", "fused", "--quick"], timer)
    rows = tables(out)["fused"]
    m, k, n = bench.QUICK.gemm
    lowered, forced = "none (as lowered)", "executor (forced)"
    assert [(r[0], r[3], r[4]) for r in rows] == [
        (op, c, how) for op in ("all_gather_matmul", "matmul_reduce_scatter") for c in ("1", "2")
        for how in (lowered, forced)]
    assert all(r[2] == f"{m} x {k} x {n}" and r[1] == "bfloat16" for r in rows)
    assert [r[8] for r in rows] == ["95%", "60%", "60%", "95%"] * 2
    # The goal is judged where the one-rank collective is lowered as users get it; the forced rows carry none.
    assert [r[9] for r in rows] == ["met", "-", "**missed**", "-"] * 2
    assert rows[0][5] == f"{1 / 0.95:.3f} ms" and rows[0][6] == "1.000 ms"
    assert float(rows[0][7]) == pytest.approx(round(2 * m * k * n / (1e-3 / 0.95) / 1e12, 1))
    assert [c[1:] for c in timer.calls if c[0] == "rounds"] == [(("dot", "fused"), bench.QUICK.rounds)] * 8
    from jaxcoll.lowering import custom_call
    assert custom_call.lower_single_rank_groups is False  # restored after the forced rows


def test_every_part_prints_in_one_run(capsys, single_rank_restored):
    out = run_main(capsys, ["--quick"], FakeTimer())
    assert out.startswith("GPU 0: Fake GPU; 8 emulated ranks (--quick")
    assert list(tables(out)) == ["bulk", "packet", "fused"]


def test_quick_shrinks_the_bulk_size(capsys):
    timer = FakeTimer()
    run_main(capsys, ["--parts", "bulk", "--quick"], timer)
    assert ("copy", 1 << 20, 20) in timer.calls


@pytest.mark.parametrize("argv,message", [
    (["--iters", "0"], "--iters must be at least 1, got 0"),
    (["--ranks", "1"], "--ranks must be 2..16 (one launch holds every emulated rank), got 1"),
    (["--ranks", "17"], "got 17"),
    (["--device", "-1"], "--device must be at least 0, got -1"),
    (["--parts", "bulk,gemm"], "--parts: gemm is not a part; the parts are bulk, packet, fused"),
    (["--parts", ","], "--parts: '' is not a part"),
])
def test_a_bad_argument_is_refused_naming_it(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        bench.main(argv, timer=FakeTimer())
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_without_a_gpu_the_benchmark_says_why():
    usable, why = runtime.cuda_status()
    if usable:
        pytest.skip("a GPU is usable here")
    with pytest.raises(SystemExit, match=re.escape(f"benchmarks/cuda.py needs a GPU: {why}")):
        bench.main(["--quick"])


def test_without_a_jax_cuda_device_the_fused_part_says_so_and_the_others_run(capsys):
    class NoJaxDevice(FakeTimer):
        @property
        def device(self):
            raise RuntimeError("Unknown backend: 'cuda' requested, but no platforms\nare instances of cuda")

    out = run_main(capsys, ["--quick"], NoJaxDevice())
    parts = tables(out)
    assert len(parts["bulk"]) == 4 and len(parts["packet"]) == 6 + 2 + 16
    assert "| jax has no CUDA device here: Unknown backend: 'cuda' requested, but no platforms are" in out


class ModelTimer:
    """Times that a known GPU model gives (packets up to 64 KiB per rank, bulk above, each with constants of its
    own), so that the tune part's fit must find those constants and predict every plan exactly."""

    def __init__(self):
        from jaxcoll.sim import gpu
        self.gpu = gpu
        self.models = {"ll": gpu.GpuModel(call_s=4e-6, step_s=300e-9, sync_s=200e-9, block_rate=20e9,
                                          signal_s=700e-9),
                       "bulk": gpu.GpuModel(call_s=9e-6, step_s=1e-6, sync_s=400e-9, block_rate=60e9,
                                            signal_s=1.5e-6)}

    def name(self):
        return "NVIDIA H200"

    def plan(self, plan, input_elements, output_elements, *, iters, graph, protocol):
        assert protocol == "auto" and graph
        nbytes = input_elements * 4
        chosen = "ll" if nbytes <= 64 << 10 else "bulk"
        return {"seconds_per_call": self.gpu.seconds(plan, nbytes, self.models[chosen], chosen), "protocol": chosen,
                "blocks_per_lane": 1, "traffic_bytes": 1}


def test_the_tune_part_fits_the_model_per_protocol_and_predicts_every_plan(capsys):
    out = run_main(capsys, ["--parts", "tune", "--quick", "--ranks", "4"], ModelTimer())
    rows = tables(out)["tune"]
    constants = {r[0]: r[1:] for r in rows if r[0] in ("ll", "bulk")}
    # call us, data step us, sync step us, GB/s a block, GB/s the device, signal us. A hop of the ring (a signal
    # step, its way, the wait step) prices a sync step twice and a signal's way once, which only their sum tells.
    hop = {p: 2 * float(c[2]) + float(c[5]) for p, c in constants.items()}
    assert [constants["ll"][i] for i in (0, 1, 3)] == ["4.00", "0.300", "20.0"]
    assert hop["ll"] == pytest.approx(1.1, 1e-2)
    assert [constants["bulk"][i] for i in (0, 1, 3)] == ["9.00", "1.000", "60.0"]
    assert hop["bulk"] == pytest.approx(2.3, 1e-2)
    plans = [r for r in rows if len(r) == 7 and r[2] in ("ll", "bulk")]
    assert {r[6] for r in plans} == {"yes", "no"}  # the synthesized plans were not in the fit
    assert any(r[0].startswith("all_gather.synth.") for r in plans)
    assert all(r[5] in ("+0%", "-0%") for r in plans), [r for r in plans if r[5] not in ("+0%", "-0%")]
    assert "Not in the fit: median |error| 0%" in out


def test_the_tune_part_replays_a_recorded_run_without_a_gpu(capsys, tmp_path):
    out = run_main(capsys, ["--parts", "tune", "--quick", "--ranks", "4"], ModelTimer())
    recorded = tmp_path / "tune.md"
    recorded.write_text(out)
    replayed = run_main(capsys, ["--parts", "tune", "--quick", "--ranks", "4", "--measured", str(recorded)], None)
    before = [r for r in tables(out)["tune"] if len(r) == 7 and r[2] in ("ll", "bulk")]
    after = [r for r in tables(replayed)["tune"] if len(r) == 7 and r[2] in ("ll", "bulk")]
    assert [r[:3] + r[4:5] + r[6:] for r in after] == [r[:3] + r[4:5] + r[6:] for r in before]  # the same cells
    # Refitted to the times as printed (to 0.1 us): the same predictions, within that rounding.
    assert all(float(a[3]) == pytest.approx(float(b[3]), rel=0.02, abs=0.2) for a, b in zip(after, before))


def test_cells_a_recording_lacks_are_named_and_one_without_any_is_refused(capsys, tmp_path):
    out = run_main(capsys, ["--parts", "tune", "--quick", "--ranks", "4"], ModelTimer())
    recorded = tmp_path / "tune.md"
    recorded.write_text("\n".join(line for line in out.splitlines() if "| shift x8 | 8 KiB |" not in line))
    replayed = run_main(capsys, ["--parts", "tune", "--quick", "--ranks", "4", "--measured", str(recorded)], None)
    assert "Not in the recording, left out: shift x8 at 8 KiB." in replayed
    recorded.write_text("| shift | 8 KiB | ll |\n")
    with pytest.raises(SystemExit, match="no time for any cell of a tune part of 4 ranks at 8 KiB, 256 KiB"):
        bench.main(["--parts", "tune", "--quick", "--ranks", "4", "--measured", str(recorded)])
