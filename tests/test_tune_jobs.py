"""jaxcoll.tune across the processes of a job: auto agrees on one plan in every process, and `jaxcoll tune` tunes a
job of several processes as it tunes one (each job launched by jaxcoll.launch, bounded in time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jaxcoll.launch import launch
from jaxcoll.sim import machine
from jaxcoll.tune import choice, file, run

CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tune_cases.py")
TRANSPORTS = {"shm": ({}, "2x4"), "tcp": ({"JAXCOLL_TRANSPORT": "tcp"}, "2x4/2hosts")}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tuning_file(path, layout: str, choice_name: str) -> None:
    """A valid tuning file for this machine whose one cell (all_reduce of 1 MiB over 2 x 4 ranks) says
    `choice_name`."""
    data = {"format": file.FORMAT, **file.versions(), "machine": file.machine(),
            "layouts": {layout: {"processes": [0] * 4 + [1] * 4, "hosts": None,
                                 "model": machine.MachineModel().to_json(),
                                 "cells": [{"collective": "all_reduce", "nranks": 8, "bytes": 1 << 20,
                                            "dtype": "float32", "choice": choice_name, "plan": None,
                                            "seconds": {choice_name: 1e-3}, "default": "hierarchical"}]}}}
    path.write_text(json.dumps(data))


def chosen(results) -> list[str]:
    out = []
    for r in results:
        assert r.returncode == 0, f"process {r.process} exited with {r.returncode}:\n{r.stderr[-4000:]}"
        line = next(l for l in r.stdout.splitlines() if l.startswith("ok same_choice"))
        out.append(line.split("chose ", 1)[1])
    return out


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_process_runs_process_0s_choice_whatever_file_it_reads(transport, tmp_path):
    env, layout = TRANSPORTS[transport]
    processes = (0,) * 4 + (1,) * 4
    hosts = (0, 1) if transport == "tcp" else None
    model_pick = choice.rank_by_model("all_reduce", 8, 1 << 20, processes, hosts,
                                      the_model=machine.MachineModel(threads=1))[0][1]
    other = "ring" if model_pick != "ring" else "direct"
    tuning_file(tmp_path / "one.json", layout, other)
    # Process 1 reads a file that says `other`; process 0 none: both run process 0's (the model's) choice.
    results = launch(2, [CASES, "same_choice"], local_devices=4, timeout_s=240,
                     env={"JAXCOLL_TIMEOUT": "60", **env},
                     process_env={0: {"JAXCOLL_TUNING": "off"}, 1: {"JAXCOLL_TUNING": str(tmp_path / "one.json")}})
    picks = chosen(results)
    assert picks[0] == picks[1] != other
    # And the other way round: process 0 reads the file, so both run `other`.
    results = launch(2, [CASES, "same_choice"], local_devices=4, timeout_s=240,
                     env={"JAXCOLL_TIMEOUT": "60", **env},
                     process_env={0: {"JAXCOLL_TUNING": str(tmp_path / "one.json")}, 1: {"JAXCOLL_TUNING": "off"}})
    assert chosen(results) == [other, other]


def run_tune(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "jaxcoll", "tune", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.parametrize("processes,transport,layout", [(1, "shm", "1x8"), (2, "shm", "2x4"),
                                                        (2, "tcp", "2x4/2hosts")])
def test_jaxcoll_tune_writes_a_file_auto_can_use(processes, transport, layout, tmp_path):
    out = tmp_path / "tuning.json"
    r = run_tune("--processes", str(processes), "--transport", transport, "--sizes", "16K",
                 "--collectives", "all_reduce,all_gather", "--reps", "2", "--passes", "2", "--top", "2",
                 "--probe-bytes", "256K", "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"wrote {out}" in r.stdout.replace("\n", "")
    loaded = file.read(str(out))
    entry = loaded.layouts[layout]
    assert {c["collective"] for c in entry["cells"]} == {"all_reduce", "all_gather"}
    for c in entry["cells"]:
        assert c["choice"] in c["seconds"] and c["default"] in c["seconds"]
        # The model's pick where it measured within CLOSE of the best median, else the best or a steadier one
        # near it (jaxcoll.tune.run.decide): never a plan measured slower than that.
        assert c["seconds"][c["choice"]] <= (1 + run.CLOSE) * min(c["seconds"].values())


def test_jaxcoll_tune_names_bad_arguments():
    for args, message in ((["--sizes", "lots"], "--sizes='lots'"), (["--collectives", "broadcast"], "broadcast"),
                          (["--devices", "6", "--processes", "4"], "--devices=6"),
                          (["--probe-bytes", "1K"], "--probe-bytes must be at least 4K"),
                          (["--reps", "2", "--passes", "3"], "--passes=3 must be at most --reps=2")):
        r = run_tune(*args, timeout=120)
        assert r.returncode != 0 and message in r.stderr, (args, r.stderr[-2000:])
