"""Argument checks of the exact collectives (and so of the public ones): each error names the argument and the
value."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxcoll.lowering import call_plan
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


def split_dimension(api_name: str, name: str, value, shape, n: int, tiled: bool) -> int:
    """`value` as the dimension of `shape` that is cut into one block per rank of a group of `n`: tiled, its
    size must be divisible by `n` (each rank's block is a slice); untiled, it must be `n` (each block is one
    row, and the dimension goes)."""
    dim = dimension(api_name, name, value, len(shape))
    size = shape[dim]
    if tiled and size % n:
        raise ValueError(f"{api_name}: x.shape[{name}={value}] = {size} is not divisible by the group size {n}")
    if not tiled and size != n:
        raise ValueError(f"{api_name}: x.shape[{name}={value}] = {size} must equal the group size {n} when "
                         f"tiled=False")
    return dim


def group_rank(api_name: str, name: str, value, n: int) -> int:
    """`value` as a rank of a group of `n` ranks: an int in [0, n)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise ValueError(f"{api_name}: {name}={value!r} is not a rank of the group; it must be an int in [0, {n})")
    return value


def permutation_pairs(api_name: str, perm, n: int) -> tuple[tuple[int, int], ...]:
    """`perm` as a tuple of (source, destination) rank pairs of a group of `n` ranks, in which no source and no
    destination repeats."""
    try:
        pairs = tuple((int(s), int(d)) for s, d in perm)
    except (TypeError, ValueError):
        raise ValueError(f"{api_name}: perm={perm!r} must be a sequence of (source, destination) pairs") from None
    for s, d in pairs:
        if not (0 <= s < n and 0 <= d < n):
            raise ValueError(f"{api_name}: perm={list(pairs)} has the pair ({s}, {d}) outside the group of {n} "
                             f"ranks (indices must be in [0, {n}))")
    for what, idx in (("source", 0), ("destination", 1)):
        seen = [p[idx] for p in pairs]
        repeats = sorted({i for i in seen if seen.count(i) > 1})
        if repeats:
            raise ValueError(f"{api_name}: perm={list(pairs)} repeats {what} rank(s) {repeats}; each rank may "
                             f"appear at most once as a {what}")
    return pairs


def check_algorithm(api_name: str, collective, nranks: int, x, algorithm, **params) -> None:
    """Fail while tracing, where the call is written, for an unknown algorithm name or a Plan that does not fit
    the call; the lowering chooses the plan again for the shapes the call finally has."""
    if isinstance(algorithm, str) and algorithm == "auto":
        return  # always known; what it runs is chosen when the call lowers
    wire = np.dtype(np.uint8) if x.dtype == np.bool_ else np.dtype(x.dtype)
    call_plan.choose(api_name, collective, nranks, x.size * wire.itemsize, wire, algorithm, **params)
