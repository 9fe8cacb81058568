"""tools/gpu_round.sh, the GPU round of issue 14, exercised without a GPU: its arguments, the dry run, the CUDA
architectures it builds for, what a step past its limit or a failing step does to the round, the round's own
budget, the prerequisites from carried wheels, the summary it writes and the folder the device tool brings back.

Steps' commands are replaced through GPU_ROUND_CMD_<STEP> (or the steps left unselected), so nothing here needs
CUDA; what the round runs on the GPU is test_cuda*.py and benchmarks/cuda.py, which skip or refuse here."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_round.sh"
WHEELS_SCRIPT = ROOT / "tools" / "gpu_round_wheels.sh"
CHECKS = ROOT / "tools" / "gpu_round_checks.py"

# The round as issue 14 lists it, in its order (an independent statement of what the script must run).
STEPS = ["env", "prereqs", "build", "import", "harness", "harness_large", "memcheck", "racecheck", "synccheck",
         "jax", "network", "never_arrives", "bench", "tune", "profile", "ncu"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="the round script needs bash and coreutils' timeout")


def run_round(*args, tmp_path: Path, env: dict | None = None, script: Path = SCRIPT, timeout: float = 120):
    """The script with a clean environment: no $OUT or GPU_ROUND_* from the caller, its scratch under tmp_path."""
    base = {k: v for k, v in os.environ.items() if k != "OUT" and not k.startswith("GPU_ROUND_")}
    base["TMPDIR"] = str(tmp_path)
    return subprocess.run(["bash", str(script), *map(str, args)], cwd=ROOT, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def fake_commands(**commands) -> dict:
    """GPU_ROUND_CMD_<STEP> for each step=command (import_ for the step import)."""
    return {f"GPU_ROUND_CMD_{step.rstrip('_').upper()}": cmd for step, cmd in commands.items()}


def results(out: Path) -> dict[str, dict]:
    """results.tsv by step."""
    lines = (out / "results.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    rows = [dict(zip(header, line.split("\t"))) for line in lines[1:]]
    return {row["step"]: row for row in rows}


def table_cells(line: str) -> list[str]:
    """A markdown table row's cells, with escaped pipes (\\|) kept inside their cell."""
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [c.strip().replace("\\|", "|") for c in cells]


# ---------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------
def test_help_lists_every_step_with_limits_within_the_issue_budget(tmp_path):
    done = run_round("--help", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    limits = {}
    for line in done.stdout.splitlines():
        m = re.match(r"\s+([a-z_]+)\s+(\d+)\s+(stop|continue)\s", line)
        if m:
            limits[m[1]] = int(m[2])
    assert list(limits) == STEPS
    # Issue 14's budget on the device: build <= 4 min, tests <= 4 min, sanitizer <= 2 min, bench <= 3 min.
    assert limits["build"] <= 240
    assert limits["harness"] + limits["harness_large"] + limits["jax"] + limits["never_arrives"] <= 240
    assert limits["memcheck"] + limits["racecheck"] + limits["synccheck"] <= 120
    assert limits["bench"] <= 180
    for option in ("--dry-run", "--only", "--skip", "--limit", "--total", "--compute-cap", "--report", "--out"):
        assert option in done.stdout


@pytest.mark.parametrize("args,names", [
    (["--bogus"], "'--bogus'"),
    (["--only", "build,nope"], "'nope' is not a step"),
    (["--skip", ""], "--skip"),
    (["--limit", "build=0"], "--limit build"),
    (["--limit", "build=soon"], "'soon'"),
    (["--limit", "bild=30"], "'bild=30'"),
    (["--total", "-5"], "--total"),
    (["--compute-cap", "nine"], "'nine'"),
    (["--compute-cap", "9"], "'9'"),
    (["--out"], "--out needs a value"),
    (["--python", "no-such-python3"], "'no-such-python3'"),
])
def test_a_bad_argument_is_a_usage_error_naming_it(tmp_path, args, names):
    out = tmp_path / "round"
    done = run_round("--out", out, *args, tmp_path=tmp_path)
    assert done.returncode == 2
    assert names in done.stderr and "--help" in done.stderr
    assert not out.exists()


def test_a_bad_limit_from_the_environment_is_a_usage_error(tmp_path):
    done = run_round("--dry-run", tmp_path=tmp_path, env={"GPU_ROUND_LIMIT_BUILD": "4min"})
    assert done.returncode == 2 and "GPU_ROUND_LIMIT_BUILD" in done.stderr and "'4min'" in done.stderr


# ---------------------------------------------------------------------------------------------------------------
# Dry run and build flags
# ---------------------------------------------------------------------------------------------------------------
def dry_run_lines(tmp_path, *args, env=None) -> dict[str, str]:
    out = tmp_path / "round"
    done = run_round("--dry-run", "--out", out, *args, tmp_path=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert not out.exists(), "a dry run wrote its folder"
    lines = {}
    for line in done.stdout.splitlines():
        key, _, rest = line.partition(" ")
        lines[key.split("=")[0]] = line if "=" in key else rest.strip()
    return lines


def test_the_dry_run_prints_every_step_with_its_command_and_runs_nothing(tmp_path):
    lines = dry_run_lines(tmp_path, "--compute-cap", "9.0", "--limit", "bench=99")
    for step in STEPS:
        assert lines[step].startswith("limit"), lines[step]
    assert "limit   99 s" in lines["bench"] and "benchmarks/cuda.py" in lines["bench"]
    build = lines["build"]
    assert "on failure stop" in build and "tools/build_inplace.sh" in build
    assert "-DJAXCOLL_CUDA=ON" in build and "-DCMAKE_CUDA_ARCHITECTURES=90-real" in build
    assert "tests/test_cuda.py" in lines["harness"] and "not never_signalled" in lines["harness"]
    assert "-m 'not large'" in lines["harness"]  # the 256 MiB cases are a step of their own
    assert "tests/test_cuda.py" in lines["harness_large"] and "-m large" in lines["harness_large"]
    assert "tests/test_cuda.py" in lines["never_arrives"] and "-k never_signalled" in lines["never_arrives"]
    assert "tests/test_cuda_jax.py" in lines["jax"] and "not cpu" in lines["jax"]
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert f"--tool {tool}" in lines[tool] and "gpu_round_checks.py sanitize" in lines[tool]
    assert "gpu_round_checks.py import" in lines["import"]


def collected(command: str) -> set[str]:
    """The test ids a step's pytest command selects (collected, not run)."""
    argv = shlex.split(command)
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q"] + [a for a in argv[3:] if a not in ("-q", "-rfEs")]
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_the_test_steps_select_every_gpu_test_once(tmp_path):
    """harness, harness_large and never_arrives split tests/test_cuda.py between them, and the jax step keeps
    every test of tests/test_cuda_jax.py that needs a GPU."""
    lines = dry_run_lines(tmp_path, "--compute-cap", "9.0")
    command = {s: lines[s].split("continue", 1)[1].strip() for s in ("harness", "harness_large", "never_arrives", "jax")}
    parts = {s: collected(command[s]) for s in ("harness", "harness_large", "never_arrives")}
    everything = collected("python3 -m pytest tests/test_cuda.py")
    assert all(parts.values()), parts
    assert sum(len(p) for p in parts.values()) == len(everything) and set().union(*parts.values()) == everything
    assert all("256_mib" in t for t in parts["harness_large"])
    jax_tests = collected(command["jax"])
    assert any("[cuda]" in t for t in jax_tests) and any("command_buffers" in t for t in jax_tests)
    assert not any("[cpu]" in t for t in jax_tests)
    assert any("test_trace_cuda.py::test_traced_calls_of_the_emulated_8_rank_harness" in t for t in jax_tests)


def test_only_and_skip_select_steps(tmp_path):
    lines = dry_run_lines(tmp_path, "--compute-cap", "9.0", "--only", "build,bench,jax", "--skip", "jax")
    selected = [s for s in STEPS if lines[s].startswith("limit")]
    assert selected == ["build", "bench"]
    assert all(lines[s] == "not selected" for s in STEPS if s not in selected)


@pytest.mark.parametrize("caps,architectures", [
    ("9.0", "90-real"),
    ("8.0", "80-real"),
    ("10.0", "100-real"),
    ("8.0,9.0", "80-real;90-real"),
    ("9.0, 9.0", "90-real"),  # one GPU kind, two GPUs
])
def test_the_build_targets_only_the_given_compute_capabilities(tmp_path, caps, architectures):
    lines = dry_run_lines(tmp_path, "--compute-cap", caps)
    assert lines["CMAKE_CUDA_ARCHITECTURES"] == f"CMAKE_CUDA_ARCHITECTURES={architectures}"
    assert f"-DCMAKE_CUDA_ARCHITECTURES={architectures}" in lines["build"].replace("\\;", ";")  # shell-quoted


def fake_nvidia_smi(tmp_path: Path, body: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/usr/bin/env bash\n" + body + "\n")
    smi.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_the_compute_capability_is_read_from_nvidia_smi(tmp_path):
    env = fake_nvidia_smi(tmp_path, 'for a in "$@"; do [[ $a == --query-gpu=compute_cap ]] && echo 9.0; done; exit 0')
    assert dry_run_lines(tmp_path, env=env)["CMAKE_CUDA_ARCHITECTURES"] == "CMAKE_CUDA_ARCHITECTURES=90-real"


def test_without_a_compute_capability_the_build_fails_saying_so(tmp_path):
    env = fake_nvidia_smi(tmp_path, 'echo "NVIDIA-SMI has failed because it could not communicate with the driver"; exit 9')
    out = tmp_path / "round"
    done = run_round("--out", out, "--only", "build,import", tmp_path=tmp_path,
                     env={**env, **fake_commands(import_="true")})
    assert done.returncode == 1
    rows = results(out)
    assert rows["build"]["status"] == "FAILED (exit 1)"
    assert "NVIDIA-SMI has failed" in rows["build"]["detail"] and "--compute-cap" in rows["build"]["detail"]
    assert rows["import"]["status"] == "not run (stopped at build)"


# ---------------------------------------------------------------------------------------------------------------
# Time limits, failures, the round's budget
# ---------------------------------------------------------------------------------------------------------------
def test_a_step_past_its_limit_is_stopped_and_the_round_stops_there(tmp_path):
    out = tmp_path / "round"
    done = run_round("--out", out, "--only", "build,import,harness", "--limit", "build=1", tmp_path=tmp_path,
                     env=fake_commands(build="sleep 60", import_="echo IMPORTED", harness="echo HARNESS"))
    assert done.returncode == 1
    rows = results(out)
    assert rows["build"]["status"] == "TIMED OUT after 1 s"
    assert float(rows["build"]["seconds"]) < 60
    assert rows["import"]["status"] == rows["harness"]["status"] == "not run (stopped at build)"
    log = (out / "round.log").read_text()
    assert "IMPORTED" not in log and "HARNESS" not in log
    assert "stops at build" in done.stdout


def test_a_step_that_ignores_the_terminate_signal_is_killed(tmp_path):
    out = tmp_path / "round"
    done = run_round("--out", out, "--only", "jax", "--limit", "jax=1", tmp_path=tmp_path,
                     env=fake_commands(jax="trap '' TERM; for i in $(seq 600); do sleep 0.1; done"))
    assert done.returncode == 1
    assert results(out)["jax"]["status"] == "TIMED OUT after 1 s"


def test_a_failing_test_step_lets_the_round_go_on(tmp_path):
    out = tmp_path / "round"
    done = run_round("--out", out, "--only", "harness,memcheck,never_arrives", tmp_path=tmp_path,
                     env=fake_commands(harness="echo '=== 3 failed, 297 passed in 41.0s ==='; exit 1",
                                       memcheck="echo '========= ERROR SUMMARY: 2 errors'; exit 1",
                                       never_arrives="echo '=== 1 passed, 299 deselected in 2.5s ==='"))
    assert done.returncode == 1
    rows = results(out)
    assert rows["harness"]["status"] == "FAILED (exit 1)"
    assert rows["harness"]["detail"] == "3 failed, 297 passed in 41.0s"
    assert rows["memcheck"]["status"] == "FAILED (exit 1)" and rows["memcheck"]["detail"] == "ERROR SUMMARY: 2 errors"
    assert rows["never_arrives"]["status"] == "passed"
    assert rows["never_arrives"]["detail"] == "1 passed, 299 deselected in 2.5s"


def test_a_step_that_would_outrun_the_round_is_not_started(tmp_path):
    out = tmp_path / "round"
    # harness gets what is left of 14 s rather than its 140; jax, with under 10 s left after it, does not start.
    done = run_round("--out", out, "--only", "harness,jax", "--total", "14", tmp_path=tmp_path,
                     env=fake_commands(harness="sleep 5", jax="echo JAX"))
    assert done.returncode == 1
    rows = results(out)
    assert rows["harness"]["status"] == "passed" and 5 < int(rows["harness"]["limit"]) <= 14
    assert rows["jax"]["status"] == "not run (no time left of the 14 s round)"
    assert "JAX" not in (out / "round.log").read_text()


# ---------------------------------------------------------------------------------------------------------------
# The prerequisites from carried wheels
# ---------------------------------------------------------------------------------------------------------------
def make_wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel holding one module, `name`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def test_prereqs_installs_a_carried_wheel_only_for_what_is_missing(tmp_path):
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "gpuroundfake", "1.2")
    make_wheel(wheels, "numpy", "0.0.1")  # carried, but the installed numpy satisfies the requirement
    out = tmp_path / "round"
    done = run_round("--out", out, "--wheels", wheels, "--only", "prereqs", tmp_path=tmp_path,
                     env={"GPU_ROUND_REQUIRES": "numpy gpuroundfake>=1.0"})
    assert done.returncode == 0, done.stdout + done.stderr
    row = results(out)["prereqs"]
    assert row["status"] == "passed" and "installed from carried wheels: gpuroundfake" in row["detail"]
    site = tmp_path / "gpu-round-site"
    assert (site / "gpuroundfake" / "__init__.py").exists()
    assert not (site / "numpy").exists()


def test_prereqs_stops_the_round_when_a_package_is_missing_and_not_carried(tmp_path):
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "gpuroundfake", "0.9")
    out = tmp_path / "round"
    done = run_round("--out", out, "--wheels", wheels, "--only", "prereqs,build", tmp_path=tmp_path,
                     env={"GPU_ROUND_REQUIRES": "gpuroundfake>=1.0 gpuroundabsent", **fake_commands(build="true")})
    assert done.returncode == 1
    rows = results(out)
    detail = rows["prereqs"]["detail"]
    assert rows["prereqs"]["status"] == "FAILED (exit 1)"
    assert "gpuroundfake-0.9-py3-none-any.whl does not satisfy gpuroundfake>=1.0" in detail
    assert "gpuroundabsent (not installed, none carried)" in detail and "tools/gpu_round_wheels.sh" in detail
    assert rows["build"]["status"] == "not run (stopped at prereqs)"


# ---------------------------------------------------------------------------------------------------------------
# The summary and the folder
# ---------------------------------------------------------------------------------------------------------------
ENV_TXT = """date: 2026-12-01
gpu: NVIDIA H200
driver: 580.159.04
compute_cap: 9.0
python: 3.12.3 /opt/torch/.venv/bin/python3
jax: 0.11.2
jaxlib: 0.11.2
nvcc: 13.0

--- nvidia-smi
(long output)
"""


def test_the_report_is_a_markdown_table_of_the_steps(tmp_path):
    rows = [
        ("env", "passed", "0.8", "30", "round_facts python3 > env.txt", ""),
        ("build", "passed", "95.2", "240", "PYTHON=python3 bash tools/build_inplace.sh -DJAXCOLL_CUDA=ON", "CMAKE_CUDA_ARCHITECTURES=90-real"),
        ("import", "FAILED (exit 1)", "4.0", "60", "python3 tools/gpu_round_checks.py import", "a | b: not usable"),
        ("harness", "not run (stopped at import)", "-", "140", "python3 -m pytest tests/test_cuda.py", ""),
        ("bench", "not selected", "-", "-", "set -o pipefail; python3 benchmarks/cuda.py | tee bench.md", ""),
    ]
    (tmp_path / "env.txt").write_text(ENV_TXT)
    (tmp_path / "results.tsv").write_text("step\tstatus\tseconds\tlimit\tcommand\tdetail\n" +
                                          "".join("\t".join(r) + "\n" for r in rows))
    done = run_round("--report", tmp_path, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert done.stdout == summary
    lines = summary.splitlines()
    assert lines[0] == "### GPU round of 2026-12-01: NVIDIA H200"
    assert "Driver 580.159.04, compute capability 9.0, Python 3.12.3, jax 0.11.2, jaxlib 0.11.2, nvcc 13.0" in summary
    table = [line for line in lines if line.startswith("|")]
    assert table_cells(table[0]) == ["step", "command", "status", "seconds", "result"]
    assert set(table[1].replace("|", "")) == {"-"}
    body = [table_cells(line) for line in table[2:]]
    want = [[step, f"`{cmd}`", status, seconds, detail] for step, status, seconds, _, cmd, detail in rows
            if status != "not selected"]
    assert body == want
    assert "The round stopped at import" in summary
    assert "Not selected in this round: bench." in summary


def test_a_report_without_results_is_an_error(tmp_path):
    done = run_round("--report", tmp_path, tmp_path=tmp_path)
    assert done.returncode == 2 and "results.tsv" in done.stderr


def test_a_whole_round_leaves_a_folder_the_device_tool_brings_back_whole(tmp_path):
    """The device tool returns at most 8 files from $OUT, at most 2 folders down, named in letters, digits, '.',
    '_' and '-'; the round's folder sits one down ($OUT/gpu-round)."""
    out_root = tmp_path / "OUT"
    out = out_root / "gpu-round"
    (tmp_path / "env.txt").write_text(ENV_TXT)
    commands = {step: "echo '=== 1 passed in 0.1s ==='" for step in STEPS}
    commands["env"] = f"cp {tmp_path}/env.txt {out}/env.txt"
    commands["bench"] = f"echo '| a | b |' > {out}/bench.md"
    done = run_round(tmp_path=tmp_path, env={"OUT": str(out_root), **fake_commands(**commands)})
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(p.relative_to(out_root) for p in out_root.rglob("*") if p.is_file())
    assert len(files) <= 8, files
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for f in files for part in f.parts)
    assert all(len(f.parts) <= 3 for f in files)
    assert {f.name for f in files} >= {"summary.md", "round.log", "results.tsv", "env.txt", "bench.md"}
    rows = results(out)
    assert [rows[s]["status"] for s in STEPS] == ["passed"] * len(STEPS)
    summary = (out / "summary.md").read_text()
    assert summary.startswith("### GPU round of 2026-12-01: NVIDIA H200")
    assert done.stdout.endswith(summary)


# ---------------------------------------------------------------------------------------------------------------
# The wheels script and the checks program
# ---------------------------------------------------------------------------------------------------------------
def test_the_wheels_script_downloads_binary_wheels_for_the_gpu_machines_python(tmp_path):
    done = run_round("--dry-run", tmp_path / "w", tmp_path=tmp_path, script=WHEELS_SCRIPT)
    assert done.returncode == 0, done.stderr
    pip = done.stdout.splitlines()[0].split()
    assert pip[:4] == ["python3", "-m", "pip", "download"]
    assert "--no-deps" in pip and "--only-binary=:all:" in pip
    assert pip[pip.index("--python-version") + 1] == "3.12" and pip[pip.index("--implementation") + 1] == "cp"
    assert "manylinux2014_x86_64" in pip and "manylinux_2_28_x86_64" in pip
    assert pip[pip.index("-d") + 1] == str(tmp_path / "w")
    assert any(p.startswith("nanobind==") for p in pip)


def test_the_wheels_script_refuses_a_bad_argument(tmp_path):
    done = run_round("--dry-run", "--python-version", "twelve", tmp_path=tmp_path, script=WHEELS_SCRIPT)
    assert done.returncode == 2 and "'twelve'" in done.stderr


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_carried_wheels_folder_is_ignored_by_git():
    done = subprocess.run(["git", "check-ignore", "-q", ".gpu-wheels/nanobind-3.1.0-py3-none-any.whl"], cwd=ROOT)
    assert done.returncode == 0


def test_the_checks_program_says_why_it_cannot_run_without_a_gpu(tmp_path):
    from jaxcoll import runtime
    usable, why = runtime.cuda_status()
    if usable:
        pytest.skip("a GPU is usable here: the round runs these checks for real")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for check in ("import", "sanitize", "network"):
        done = subprocess.run([sys.executable, str(CHECKS), check], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 1 and why in done.stderr, done.stderr
    done = subprocess.run([sys.executable, str(CHECKS), "sanitize", "--ranks", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--ranks must be at least 2, got 1" in done.stderr


def load_checks():
    spec = importlib.util.spec_from_file_location("gpu_round_checks", CHECKS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_import_checks_custom_call_compiles_and_runs_on_the_cpu(monkeypatch):
    """The import step's program, on the CPU device where no GPU is: the same lowering and compile it asks of
    XLA's CUDA platform, and the identity a one-rank all_reduce must be."""
    import jax
    from jaxcoll.lowering import custom_call
    monkeypatch.setattr(custom_call, "lower_single_rank_groups", False)  # the check sets it; restored after
    lowered, compiled, x = load_checks().one_rank_all_reduce(jax.devices("cpu")[0])
    assert "jaxcoll_all_reduce" in lowered.as_text()
    np.testing.assert_array_equal(np.asarray(compiled(x)), np.arange(64, dtype=np.float32))


def test_the_sanitizer_cases_match_numpy_on_the_cpu_executor():
    """The sanitizer step's plans and references, run by the CPU executor (the GPU runs the same words)."""
    from jaxcoll import runtime
    checks = load_checks()
    seen = []

    def run_cpu(words, xs, shape, reduce_op, protocol, offsets):
        seen.append((protocol, offsets))
        if offsets:  # the CPU executor reads inputs where they lie: each starts that many elements into an array
            xs = [np.concatenate([np.zeros(off, x.dtype), x])[off:] for x, off in zip(xs, offsets[0])]
        return runtime.run_words(words, xs, shape, reduce_op, 30.0), {"executor": "cpu"}

    lines = checks.check_all_reduce(run_cpu, ranks=4, chunk_elements=7)
    assert len(lines) == len(seen) == 4 and {p for p, _ in seen} == {"bulk", "ll"}
    misaligned = [o for _, o in seen if o]
    assert len(misaligned) == 1 and all(len(set(side)) > 1 and max(side) < 8 for side in misaligned[0])


def test_the_sanitizer_check_names_the_rank_that_differs():
    from jaxcoll import runtime
    checks = load_checks()

    def run_wrong(words, xs, shape, reduce_op, protocol, offsets):
        outs = runtime.run_words(words, xs, shape, reduce_op, 30.0)
        outs[2] = outs[2] + 1
        return outs, {}

    with pytest.raises(AssertionError, match="rank 2, all_reduce ring on bulk"):
        checks.check_all_reduce(run_wrong, ranks=4, chunk_elements=7)


def test_a_failed_build_reports_its_first_error(tmp_path):
    build_log = tmp_path / "build.log"
    build_log.write_text("[1/9] Building CUDA object kernels_float.cu.o\n"
                         'csrc/cuda/kernel.cuh(12): error: identifier "x" is undefined\n'
                         "ninja: build stopped: subcommand failed.\n")
    out = tmp_path / "round"
    done = run_round("--out", out, "--only", "build", "--compute-cap", "9.0", tmp_path=tmp_path,
                     env=fake_commands(build=f"cat {build_log}; exit 1"))
    assert done.returncode == 1
    assert results(out)["build"]["detail"] == 'csrc/cuda/kernel.cuh(12): error: identifier "x" is undefined'


def test_a_test_step_whose_tests_skip_for_want_of_a_gpu_has_not_passed(tmp_path):
    """pytest exits 0 when every test skips; on the GPU round a test skipped for want of a GPU did not run."""
    log = tmp_path / "pytest.log"
    log.write_text("sss.s\n"
                   "SKIPPED [8] tests/test_cuda.py:152: no usable CUDA device: cudaErrorNoDevice: no CUDA-capable device\n"
                   "SKIPPED [3] tests/test_cuda.py:98: jaxcoll was built without the CUDA executor\n"
                   "SKIPPED [1] tests/test_cuda.py:201: custom is a custom collective with no numpy reference here\n"
                   "1 passed, 12 skipped in 0.5s\n")
    other = tmp_path / "other.log"
    other.write_text("SKIPPED [1] tests/test_cuda.py:201: custom is a custom collective with no numpy reference here\n"
                     "40 passed, 1 skipped in 9.0s\n")
    out = tmp_path / "round"
    done = run_round("--out", out, "--only", "harness,jax", tmp_path=tmp_path,
                     env=fake_commands(harness=f"cat {log}", jax=f"cat {other}"))
    assert done.returncode == 1
    rows = results(out)
    assert rows["harness"]["status"] == "FAILED (11 skipped for want of a GPU)"
    assert rows["harness"]["detail"] == "1 passed, 12 skipped in 0.5s"
    assert rows["jax"]["status"] == "passed"


def test_the_network_checks_cases_are_the_collectives_over_one_rank_and_lower_with_the_lowerings_attributes():
    """The network step's cases (tools/gpu_round_checks.py network): every collective, their expectations from
    the one-rank contract (identity; zeros for a ppermute rank no pair targets), and the call each lowers to for
    XLA's CUDA platform carrying every attribute the handler binds."""
    import jax
    from jaxcoll.plan import Collective
    checks = load_checks()
    cases = checks.network_cases()
    assert {phase.collective for _, phase, _, _ in cases} == set(Collective) - {Collective.CUSTOM}
    for label, phase, x, want in cases:
        no_target = phase.collective is Collective.PPERMUTE and not phase.pairs
        np.testing.assert_array_equal(want, np.zeros_like(x) if no_target else x, err_msg=label)
        text = checks.one_rank_network_call(phase, x).trace(x).lower(lowering_platforms=("cuda",)).as_text()
        call = next(line for line in text.splitlines() if "@jaxcoll_network" in line)
        for name in ("collective", "reduce_op", "groups", "group_size", "root", "pairs"):
            assert f"{name} = " in call, (label, name, call)
