"""Argument checks shared by the public collectives: each error names the argument and the value."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxcoll.lowering import plans
from jaxcoll.lowering.dtypes import check_dtype


def leaf_array(api_name: str, x, op: str | None = None):
    """`x` as a jax value of a dtype the runtime handles for this call (op=None: data movement only)."""
    x = jnp.asarray(x)
    check_dtype(api_name, x.dtype, op)
    return x


def dimension(api_name: str, name: str, value, ndim: int) -> int:
    """`value` as a dimension index in [0, ndim) (negative counts from the end); `ndim` counts the positions
    the argument may take (one more than the operand's rank where it names a new dimension)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not -ndim <= value < ndim:
        raise ValueError(f"{api_name}: {name}={value!r} is out of range; it must be in [{-ndim}, {ndim})")
    return int(value) % ndim


def check_algorithm(api_name: str, collective, nranks: int, x, algorithm, **params) -> None:
    """Fail while tracing, where the call is written, for an unknown algorithm name or a Plan that does not fit
    the call; the lowering chooses the plan again for the shapes the call finally has."""
    wire = np.dtype(np.uint8) if x.dtype == np.bool_ else np.dtype(x.dtype)
    plans.choose(api_name, collective, nranks, x.size * wire.itemsize, wire, algorithm, **params)
