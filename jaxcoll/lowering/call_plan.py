"""The plan a call runs: `jaxcoll.algorithms.select` at trace time, for the group size and bytes of the call;
for "auto" on the CPU runtime, for the collectives that have several candidates, `jaxcoll.tune.choose` (the
tuning file's measured choice, else the model's). On GPUs "auto" keeps `jaxcoll.algorithms.tuning`'s table: the
model prices the CPU executor, and the CUDA executor's constants are not measured yet (docs/tuning.md, "GPU").

The public functions call `choose` once while tracing so that a bad `algorithm=` fails where the user wrote it;
the lowering calls it again with the shapes the call finally has (after vmap, or as a transpose) and embeds
the plan it gets.
"""

from __future__ import annotations

import numpy as np

from jaxcoll.plan import Collective, Plan


def choose(api_name: str, collective: Collective, nranks: int, nbytes: int, dtype, algorithm, *,
           hosts: tuple[int, ...] | None = None, platform: str = "cpu", **params) -> Plan:
    """`hosts[p]`: the host of the group's process p, when its processes are on several hosts; `platform`:
    "cpu", or "gpu" for a program lowered for GPUs."""
    from jaxcoll import algorithms  # imported late: algorithms may import plan tooling we do not need eagerly

    try:  # select rejects anything but a known name or a Plan, listing the known names
        if isinstance(algorithm, str) and algorithm == "auto" and nranks > 1 and nbytes > 0 and platform == "cpu":
            from jaxcoll.tune import choice, registry  # not jaxcoll.tune, whose measurements run collectives
            if collective in registry.TUNED:
                return choice.choose(collective, nranks, nbytes, np.dtype(dtype), params.get("processes"), hosts,
                                     agree=True)[1]
        return algorithms.select(collective, nranks, nbytes, np.dtype(dtype), algorithm, **params)
    except ValueError as e:
        raise ValueError(f"{api_name}: {e}") from e


def for_transpose(algorithm, same_collective: bool):
    """The algorithm a transposed call uses: the same name when it is the same collective, else "auto" (a
    Plan or a name is written for one collective and one set of parameters)."""
    if same_collective and isinstance(algorithm, str):
        return algorithm
    return "auto"
