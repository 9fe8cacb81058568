"""What the tests of the replacement (tests/test_replace*.py) share: the programs of every jax.lax collective,
how they are put in a shard_map and fed, and how a compiled program's collectives are read from its HLO."""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from sharded import all_axes, group_size, mesh, put, small_ints

XLA_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                   "collective-broadcast")


def xla_collectives(text: str) -> list[str]:
    """XLA's collectives in a compiled program's HLO text, in the order of XLA_COLLECTIVES."""
    return [op for op in XLA_COLLECTIVES if re.search(rf"\b{op}(-start|-done)?\(", text)]


def jaxcoll_calls(text: str) -> set[str]:
    """The targets of jaxcoll's custom calls in a compiled program's HLO text."""
    return set(re.findall(r'custom_call_target="(jaxcoll_\w+)"', text))


def spmd(fn, mesh_name, *, check_vma=True):
    """shard_map of fn with every input and output split over all mesh axes along the leading dimension."""
    spec = P(all_axes(mesh_name))
    return jax.shard_map(fn, mesh=mesh(mesh_name), in_specs=spec, out_specs=spec, check_vma=check_vma)


def ints(shape, mesh_name, dtype=np.float32, seed=0):
    return put(small_ints(np.random.default_rng(seed), shape, dtype), mesh_name)


def first_rank(fn):
    """fn on each rank's block with its leading unit dimension dropped and put back (results of any rank)."""
    return lambda v: jax.tree.map(lambda y: y[None], fn(v[0]))


def _collective_cases():
    n = lambda mesh_name, axis: group_size(mesh_name, axis)  # noqa: E731
    return {
        "psum": lambda a, mn: lambda v: lax.psum(v, a),
        "pmean": lambda a, mn: lambda v: lax.pmean(v, a),
        "pmax": lambda a, mn: lambda v: lax.pmax(v, a),
        "pmin": lambda a, mn: lambda v: lax.pmin(v, a),
        "all_gather": lambda a, mn: lambda v: lax.all_gather(v, a),
        "all_gather_axis1_tiled": lambda a, mn: lambda v: lax.all_gather(v, a, axis=1, tiled=True),
        "all_gather_invariant": lambda a, mn: lambda v: lax.all_gather(v, a, tiled=True, to="invarying"),
        "psum_scatter_tiled": lambda a, mn: lambda v: lax.psum_scatter(v, a, scatter_dimension=1, tiled=True),
        "psum_scatter": lambda a, mn: lambda v: lax.psum_scatter(
            jnp.broadcast_to(v[:1], (n(mn, a), *v.shape[1:])), a),
        "all_to_all_tiled": lambda a, mn: lambda v: lax.all_to_all(v, a, 1, 0, tiled=True),
        "all_to_all": lambda a, mn: lambda v: lax.all_to_all(
            jnp.broadcast_to(v[:1], (n(mn, a), *v.shape[1:])), a, 0, 1),
        "ppermute": lambda a, mn: lambda v: lax.ppermute(
            v, a, [(i, (i + 1) % n(mn, a)) for i in range(n(mn, a))]),
        "ppermute_partial": lambda a, mn: lambda v: lax.ppermute(v, a, [(0, n(mn, a) - 1)]),
        "pbroadcast": lambda a, mn: lambda v: lax.pbroadcast(v, a, n(mn, a) - 1),
    }


# case name -> (axis_name, mesh name) -> the per-rank function of one collective
CASES = _collective_cases()


def xla_reference(case: str, mesh_name: str, axis_name):
    """What XLA runs to give `case`'s result: the case itself, but for pbroadcast, which XLA:CPU cannot lower
    (the root's row of an all_gather is the same)."""
    if case == "pbroadcast":
        return lambda v: gathered_row(v, axis_name, group_size(mesh_name, axis_name) - 1)
    return CASES[case](axis_name, mesh_name)


def gathered_row(v, axes, root):
    """lax.pbroadcast(v, axes, root) as XLA:CPU can run it: the root's row of an all_gather."""
    return lax.all_gather(v, axes)[root]


def point_to_point(v):
    """lax collectives jaxcoll has no counterpart for: a psend to the next of the 8 ranks of "i" and the matching
    precv (XLA lowers them on GPUs only). jax 0.12 deprecates both; what the tests check is only that some lax
    collective jaxcoll lacks falls back."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        psend, precv = lax.psend, lax.precv
    perm = [(i, (i + 1) % 8) for i in range(8)]
    token = psend(v, "i", perm)
    return precv(token, jax.ShapeDtypeStruct(v.shape, v.dtype), "i", perm)


def every_collective(broadcast=lax.pbroadcast):
    """A program over the 2x4 mesh whose result depends on each jax.lax collective (`broadcast` stands for
    lax.pbroadcast; gathered_row where XLA runs the program)."""
    def fn(v):
        a = lax.pmean(v, "y")
        b = lax.all_gather(v, "x", axis=1, tiled=True)
        c = lax.psum_scatter(b, ("x", "y"), scatter_dimension=1, tiled=True)
        d = lax.all_to_all(v, "y", 1, 2, tiled=True)
        e = lax.ppermute(v, "x", [(0, 1), (1, 0)])
        f = broadcast(v, ("x", "y"), 3)
        g = lax.pmax(v, "x") + lax.pmin(v, "y")
        return (a + e + f + g).sum() + c.sum() + d.sum() + v * 0
    return fn


def skip_reason(case: str, mesh_name: str, axis_name) -> str | None:
    """Why `case` over `axis_name` cannot run on this JAX, or None."""
    if case.startswith("ppermute") and isinstance(axis_name, tuple) and axis_name != all_axes(mesh_name) and \
            getattr(jax.config, "jax_raise_on_ppermute_sort_diff", False):
        return "lax.ppermute refuses a tuple of axes out of mesh order on this JAX"
    return None
