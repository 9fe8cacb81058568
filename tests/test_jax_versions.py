"""The supported JAX range is stated once in pyproject.toml and checked at import: an unsupported jax, or a jaxlib
other than the one the native module was built against, fails at `import jaxcoll` with one error naming both
versions, not deep inside a call."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import jax
import jaxlib.version
import pytest

import jaxcoll
from jaxcoll import _jax

REPO = Path(__file__).resolve().parents[1]


def _python(program: str, tmp_path) -> subprocess.CompletedProcess:
    # Outside the checkout, with the folder this session imports jaxcoll from first on the path, so `python -c`
    # imports the same jaxcoll (installed, editable, or a checkout on PYTHONPATH).
    where = str(Path(jaxcoll.__file__).resolve().parents[1])
    path = os.pathsep.join([where] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=path))


def test_pyproject_states_the_range_the_import_checks():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"jax{_jax.SUPPORTED_JAX}" in project["dependencies"]
    assert f"jaxlib{_jax.SUPPORTED_JAX}" in project["dependencies"]
    assert _jax.SUPPORTED_JAX == ">=0.10.2,<0.13"


def test_the_running_jax_is_in_the_range():
    _jax.check_version(jax.__version__)


@pytest.mark.parametrize("version,supported", [
    ("0.10.2", True), ("0.11.2", True), ("0.12.0.1", True), ("0.12.9", True),
    ("0.10.1", False), ("0.9.2", False), ("0.13.0", False), ("0.13.0.dev20260101", False), ("1.0.0", False)])
def test_check_version_accepts_exactly_the_range(version, supported):
    if supported:
        _jax.check_version(version)
    else:
        with pytest.raises(ImportError, match=rf"jax{_jax.SUPPORTED_JAX}.*jax {version} is installed"):
            _jax.check_version(version)


@pytest.mark.parametrize("version", ["0.9.2", "0.13.0"])
def test_importing_under_an_unsupported_jax_raises_one_import_error_naming_both(version, tmp_path):
    out = _python(f"import jax\njax.__version__ = {version!r}\n"
                  "try:\n    import jaxcoll\nexcept ImportError as e:\n    print('ImportError:', e)\n", tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"ImportError: jaxcoll supports jax>=0.10.2,<0.13, but jax {version} is installed" in out.stdout


def test_the_native_module_refuses_another_jaxlib(tmp_path):
    # jax checks jaxlib's version when it is imported, so the running jaxlib "changes" only after that.
    out = _python("import jaxcoll\nimport jaxlib.version\njaxlib.version.__version__ = '0.10.1'\n"
                  "try:\n    import jaxcoll.runtime\nexcept ImportError as e:\n    print('ImportError:', e)\n", tmp_path)
    assert out.returncode == 0, out.stderr
    assert (f"ImportError: jaxcoll's native module was built against jaxlib {jaxlib.version.__version__}, but "
            f"jaxlib 0.10.1 is running") in out.stdout


def test_the_native_module_was_built_against_the_running_jaxlib():
    import jaxcoll.runtime
    assert jaxcoll.runtime._jaxcoll.jaxlib_version == jaxlib.version.__version__
    assert jaxcoll.__version__
