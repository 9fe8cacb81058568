"""The `compression=` (and op="adasum") entry of the public collectives: checks the arguments while tracing and
hands each leaf to the scheme that runs it (quantized.py, sparse.py, adasum.py). The public collectives in
jaxcoll/collectives/ call these and do nothing else with compression; the schemes run their hops on the exact
collectives (jaxcoll.exact), the layer below both."""

from __future__ import annotations

import jax.numpy as jnp
from jax import tree_util

from jaxcoll.compress.adasum import adasum
from jaxcoll.compress import quantized, sparse, two_level
from jaxcoll.compress.formats import Bf16, check_operand, parse
from jaxcoll.exact.arguments import dimension, split_dimension
from jaxcoll.lowering import groups


def _scheme(api_name: str, compression, algorithm, *, sparse_ok: bool):
    if isinstance(compression, sparse.TopK):
        if not sparse_ok:
            raise ValueError(f"{api_name}: compression={compression!r} (sparse) applies to all_reduce only")
        return compression
    fmt = parse(api_name, compression)
    if not isinstance(fmt, Bf16) and algorithm != "auto":
        raise ValueError(f"{api_name}: algorithm={algorithm!r} cannot be combined with "
                         f"compression={fmt.name!r}, which runs its own two hops; use algorithm='auto'")
    return fmt


def no_index_groups(api_name: str, axis_index_groups, **asked) -> None:
    """The compressed collectives (and adasum) run over whole axes: `axis_index_groups` with them is refused,
    naming what was asked for (`asked`: the keywords that chose this entry, e.g. compression="int8")."""
    if axis_index_groups is not None:
        chosen = ", ".join(f"{k}={v!r}" for k, v in asked.items() if v is not None)
        raise ValueError(f"{api_name}: axis_index_groups={axis_index_groups!r} applies to the exact collectives "
                         f"only; it cannot be combined with {chosen}")


def compressed_axes(api_name: str, axes: tuple, compress_axes, compression, algorithm) -> tuple | None:
    """`compress_axes` as a tuple of the axes of `axes` that are compressed, or None for all of them (the flat
    path). The rest of `axes` are summed exactly (two_level.py)."""
    if compress_axes is None:
        return None
    if compression is None:
        raise ValueError(f"{api_name}: compress_axes={compress_axes!r} needs a compression, got compression=None")
    if isinstance(compression, sparse.TopK):
        raise ValueError(f"{api_name}: compress_axes={compress_axes!r} cannot be combined with "
                         f"compression={compression!r} (sparse); it applies to 'bf16', 'fp8' and 'int8'")
    named = tuple(compress_axes) if isinstance(compress_axes, (tuple, list)) else (compress_axes,)
    if not named or len(set(named)) != len(named) or not set(named) <= set(axes):
        raise ValueError(f"{api_name}: compress_axes={compress_axes!r} must name one or more distinct axes of "
                         f"axis_name={axes!r}")
    if algorithm != "auto":
        raise ValueError(f"{api_name}: algorithm={algorithm!r} cannot be combined with "
                         f"compress_axes={compress_axes!r}, which runs its own three hops; use algorithm='auto'")
    return None if set(named) == set(axes) else named


def all_reduce(x, axis_name, *, op, algorithm, compression, compress_axes=None):
    api = "jaxcoll.all_reduce"
    if op == "adasum" and compress_axes is not None:
        raise ValueError(f"{api}: op='adasum' cannot be combined with compress_axes={compress_axes!r}")
    if op == "adasum":
        if compression is not None:
            raise ValueError(f"{api}: op='adasum' cannot be combined with compression={compression!r}")
        return adasum(x, axis_name)
    if op != "sum":
        raise ValueError(f"{api}: compression={compression!r} needs op='sum', got op={op!r}")
    axes = groups.axis_names(axis_name, api)
    outer = compressed_axes(api, axes, compress_axes, compression, algorithm)
    scheme = _scheme(api, compression, algorithm, sparse_ok=True)

    def run(leaf):
        leaf = jnp.asarray(leaf)
        if isinstance(scheme, sparse.TopK):
            return sparse.topk_leaf(leaf, axes, scheme, api)[0]
        check_operand(api, scheme, leaf, leaf.size)
        if outer is not None:
            return two_level.all_reduce(leaf, axes, outer, scheme)
        return quantized.all_reduce(leaf, axes, scheme, algorithm)

    return tree_util.tree_map(run, x)


def reduce_scatter(x, axis_name, *, scatter_dimension, tiled, op, algorithm, compression, compress_axes=None):
    api = "jaxcoll.reduce_scatter"
    if op != "sum":
        raise ValueError(f"{api}: compression={compression!r} needs op='sum', got op={op!r}")
    axes = groups.axis_names(axis_name, api)
    outer = compressed_axes(api, axes, compress_axes, compression, algorithm)
    n = groups.group_size(axes)
    fmt = _scheme(api, compression, algorithm, sparse_ok=False)

    def run(leaf):
        leaf = jnp.asarray(leaf)
        if leaf.ndim == 0:
            raise ValueError(f"{api}: x must have rank >= 1 to be scattered, got a scalar")
        dim = split_dimension(api, "scatter_dimension", scatter_dimension, leaf.shape, n, bool(tiled))
        check_operand(api, fmt, leaf, leaf.size // n)
        if outer is not None:
            return two_level.reduce_scatter(leaf, axes, outer, fmt, scatter_dimension=dim, tiled=bool(tiled))
        return quantized.reduce_scatter(leaf, axes, fmt, scatter_dimension=dim, tiled=bool(tiled),
                                        algorithm=algorithm)

    return tree_util.tree_map(run, x)


def all_gather(x, axis_name, *, axis, tiled, algorithm, compression):
    api = "jaxcoll.all_gather"
    axes = groups.axis_names(axis_name, api)
    fmt = _scheme(api, compression, algorithm, sparse_ok=False)

    def run(leaf):
        leaf = jnp.asarray(leaf)
        if tiled and leaf.ndim == 0:
            raise ValueError(f"{api}: tiled=True needs an operand of rank >= 1, got a scalar")
        dim = dimension(api, "axis", axis, leaf.ndim if tiled else leaf.ndim + 1)
        check_operand(api, fmt, leaf, leaf.size)
        return quantized.all_gather(leaf, axes, fmt, axis=dim, tiled=bool(tiled), algorithm=algorithm)

    return tree_util.tree_map(run, x)
