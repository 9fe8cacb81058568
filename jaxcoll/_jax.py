"""jaxcoll's contact with JAX's versions: the supported range, and every use of private JAX in jaxcoll, each
with the public API it stands in for (or the lack of one) and the versions it was checked on.

No other module imports `jax._src` (tests/test_private_jax.py holds them to it): when a JAX release moves
something private, this file is the one to change.
"""

from __future__ import annotations

import re

# The supported JAX releases: from JAX_OLDEST up to, not including, JAX_BELOW. pyproject.toml states the same
# range in its dependencies (tests/test_jax_versions.py holds them equal). 0.10.2 is the newest JAX for Python
# 3.11; 0.11.x and 0.12.x need Python >= 3.12.
JAX_OLDEST = (0, 10, 2)
JAX_BELOW = (0, 13)
SUPPORTED_JAX = f">={'.'.join(map(str, JAX_OLDEST))},<{'.'.join(map(str, JAX_BELOW))}"


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string: "0.12.0.1" -> (0, 12, 0, 1), "0.13.0.dev20260101" -> (0, 13, 0)."""
    numbers = []
    for part in version.split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        numbers.append(int(match.group()))
        if match.end() != len(part):
            break
    return tuple(numbers)


def check_version(version: str | None = None) -> None:
    """ImportError naming the installed JAX and the supported range unless `version` (default: the installed
    jax.__version__) is in the range."""
    if version is None:
        import jax
        version = jax.__version__
    if not JAX_OLDEST <= release(version) < JAX_BELOW:
        raise ImportError(
            f"jaxcoll supports jax{SUPPORTED_JAX}, but jax {version} is installed. Install a supported JAX "
            f"(python -m pip install 'jax{SUPPORTED_JAX}'), then rebuild jaxcoll against its jaxlib.")


def distributed_client():
    """jax.distributed's key-value client, or None before jax.distributed.initialize(). No public API exposes
    it (jax.distributed has initialize/shutdown only). Checked on jax 0.10.2."""
    from jax._src import distributed
    return distributed.global_state.client


def coordinator_address() -> str | None:
    """The address jax.distributed.initialize was given for the coordinator (None before it). No public API
    exposes it. Checked on jax 0.10.2."""
    from jax._src import distributed
    return distributed.global_state.coordinator_address
