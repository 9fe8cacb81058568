"""The JAXCOLL_* environment settings: docs/runtime.md's table lists exactly the ones the sources read, a
well-formed value takes effect, and a malformed one is an error naming the variable and the value."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jaxcoll
from jaxcoll import distributed

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("csrc", "xla_ffi", "jaxcoll", "benchmarks", "examples", "tools")
NAME = re.compile(r"\bJAXCOLL_[A-Z0-9_]*[A-Z0-9]\b")
# Names the compiler or CMake sees, not the environment: macros and build options.
BUILD_NAME = re.compile(r"#\s*(?:define|ifdef|ifndef)\s+(JAXCOLL_\w+)|defined\((JAXCOLL_\w+)\)")


def source_files():
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix in (".py", ".cc", ".hpp", ".cu", ".cuh", ".sh") and path.is_file():
                yield path


def settings_in_sources() -> set[str]:
    names, build = set(), set(NAME.findall((REPO / "CMakeLists.txt").read_text()))
    for path in source_files():
        text = path.read_text()
        names |= set(NAME.findall(text))
        build |= {a or b for a, b in BUILD_NAME.findall(text)}
    return names - build


def settings_section() -> str:
    text = (REPO / "docs" / "runtime.md").read_text()
    return text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]


def settings_in_docs() -> set[str]:
    return set(re.findall(r"^\| `(JAXCOLL_\w+)` \|", settings_section(), re.M))


def documented_default(name: str) -> str:
    """The first word of the default column of `name`'s row in docs/runtime.md's Settings table."""
    row = re.search(rf"^\| `{name}` \| ([^ |]+)", settings_section(), re.M)
    assert row, f"{name} has no row in docs/runtime.md's Settings table"
    return row.group(1)


def test_the_docs_table_lists_every_setting_the_sources_read_and_no_other():
    in_sources, in_docs = settings_in_sources(), settings_in_docs()
    assert in_sources - in_docs == set(), "read in the sources but missing from docs/runtime.md's Settings table"
    assert in_docs - in_sources == set(), "in docs/runtime.md's Settings table but read nowhere"


def test_the_sources_scan_finds_settings_of_both_sides():
    # Guards the scan itself: a setting of the C++ runtime, one of the Python side, and no build macro.
    found = settings_in_sources()
    assert {"JAXCOLL_TIMEOUT", "JAXCOLL_SPIN", "JAXCOLL_CUDA_BLOCKS", "JAXCOLL_NET_PORT"} <= found
    assert not found & {"JAXCOLL_WITH_CUDA", "JAXCOLL_CUDA", "JAXCOLL_CUDA_TRY", "JAXCOLL_JAXLIB_VERSION"}


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    # The folder this session imports jaxcoll from goes first on the path, so the child imports the same jaxcoll.
    where = str(Path(jaxcoll.__file__).resolve().parents[1])
    path = os.pathsep.join([where] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JAXCOLL_")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(clean, PYTHONPATH=path, **env), cwd=REPO / "tests")


@pytest.mark.parametrize("name, value", [("JAXCOLL_SPIN", "abc"), ("JAXCOLL_NT_BYTES", "4M"),
                                         ("JAXCOLL_TIMEOUT", "0"), ("JAXCOLL_SOLO_BYTES", "-1"),
                                         ("JAXCOLL_LOG_JOINS", "yes"), ("JAXCOLL_CUDA_BLOCKS", "0"),
                                         ("JAXCOLL_CUDA_BLOCKS", "33"), ("JAXCOLL_CUDA_POLL", "fast"),
                                         ("JAXCOLL_CUDA_SCOPE", "device")])
def test_a_malformed_runtime_setting_fails_the_load_naming_variable_and_value(name, value):
    out = run_python("import jaxcoll.runtime", **{name: value})
    assert out.returncode != 0
    assert f"ValueError: malformed jaxcoll setting in the environment: {name}='{value}' is not" in out.stderr, \
        out.stderr[-2000:]


PRINT_SETTINGS = "from jaxcoll import runtime, _jaxcoll; print(runtime.default_timeout_s(), _jaxcoll.solo_bytes())"


def test_well_formed_runtime_settings_take_effect():
    out = run_python(PRINT_SETTINGS, JAXCOLL_TIMEOUT="2.5", JAXCOLL_SOLO_BYTES="12345", JAXCOLL_LOG_JOINS="0",
                     JAXCOLL_SPIN="")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2.5", "12345"]


def test_unset_runtime_settings_take_their_documented_defaults():
    out = run_python(PRINT_SETTINGS)
    assert out.returncode == 0, out.stderr[-2000:]
    timeout, solo = out.stdout.split()
    assert float(timeout) == float(documented_default("JAXCOLL_TIMEOUT"))
    assert solo == documented_default("JAXCOLL_SOLO_BYTES")


@pytest.mark.parametrize("value", ["0", "1"])
def test_the_old_on_off_trace_flag_is_an_error_naming_the_join_log(value):
    # JAXCOLL_TRACE names the trace file now; the join log it used to switch on is JAXCOLL_LOG_JOINS.
    out = run_python("import jaxcoll", JAXCOLL_TRACE=value)
    assert out.returncode != 0
    assert f"JAXCOLL_TRACE={value!r} is not a file path" in out.stderr and "JAXCOLL_LOG_JOINS=1" in out.stderr, \
        out.stderr[-2000:]


def test_the_join_log_prints_each_ranks_join():
    code = ("import jax, jax.numpy as jnp, jaxcoll\n"
            "from jax.sharding import NamedSharding, PartitionSpec as P\n"
            "m = jax.make_mesh((2,), ('i',))\n"
            "f = jax.jit(jax.shard_map(lambda x: jaxcoll.all_reduce(x, 'i'), mesh=m, in_specs=P('i'), "
            "out_specs=P('i')))\n"
            "jax.block_until_ready(f(jax.device_put(jnp.ones(4), NamedSharding(m, P('i')))))\n")
    out = run_python(code, JAXCOLL_LOG_JOINS="1", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"rank 0 joins launch -?\d+", out.stderr) and "rank 1 joins launch" in out.stderr


@pytest.mark.parametrize("value", ["http", "12x", "70000", "-1"])
def test_a_malformed_network_port_is_an_error_naming_it(monkeypatch, value):
    monkeypatch.setenv("JAXCOLL_NET_PORT", value)
    with pytest.raises(ValueError, match=f"JAXCOLL_NET_PORT={value!r} is not a port number"):
        distributed._net_port()


@pytest.mark.parametrize("value, port", [("", 0), ("0", 0), ("8476", 8476)])
def test_a_network_port_is_read_whole(monkeypatch, value, port):
    monkeypatch.setenv("JAXCOLL_NET_PORT", value)
    assert distributed._net_port() == port


def test_an_unknown_transport_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("JAXCOLL_TRANSPORT", "udp")
    with pytest.raises(ValueError, match="JAXCOLL_TRANSPORT='udp' is not a transport"):
        distributed._forced_network()
