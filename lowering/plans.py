"""The plan a call runs: `jaxcoll.algorithms.select` at trace time, for the group size and bytes of the call.

The public functions call `choose` once while tracing so that a bad `algorithm=` fails where the user wrote it;
the lowering calls it again with the shapes the call finally has (after vmap, or as a transpose) and embeds
the plan it gets.
"""

from __future__ import annotations

import numpy as np

from jaxcoll.plan import Collective, Plan


def choose(api_name: str, collective: Collective, nranks: int, nbytes: int, dtype, algorithm,
           **params) -> Plan:
    from jaxcoll import algorithms  # imported late: algorithms may import plan tooling we do not need eagerly

    try:  # select rejects anything but a known name or a Plan, listing the known names
        return algorithms.select(collective, nranks, nbytes, np.dtype(dtype), algorithm, **params)
    except ValueError as e:
        raise ValueError(f"{api_name}: {e}") from e


def for_transpose(algorithm, same_collective: bool):
    """The algorithm a transposed call uses: the same name when it is the same collective, else "auto" (a
    Plan or a name is written for one collective and one set of parameters)."""
    if same_collective and isinstance(algorithm, str):
        return algorithm
    return "auto"
