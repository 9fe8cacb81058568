"""Bad input fails while tracing, with an error that names the argument and the offending value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcoll
from jaxcoll.algorithms import builtin
from jaxcoll.plan import Collective
from sharded import mesh


def trace(fn, shape=(8, 8), dtype=jnp.float32, mesh_name="2x4"):
    """Trace fn on one rank's block (no compilation: these errors must come before it)."""
    m = mesh(mesh_name)
    spec = jax.P(m.axis_names)
    x = jax.ShapeDtypeStruct(shape, dtype, sharding=jax.NamedSharding(m, spec))
    return jax.jit(jax.shard_map(lambda v: fn(v[0])[None], mesh=m, in_specs=spec, out_specs=spec,
                                 check_vma=False)).trace(x)


@pytest.mark.parametrize("call", [
    lambda v: jaxcoll.all_reduce(v, "z"), lambda v: jaxcoll.all_gather(v, ("x", "nope")),
    lambda v: jaxcoll.reduce_scatter(v, "z", tiled=True), lambda v: jaxcoll.all_to_all(v, "z", 0, 0),
    lambda v: jaxcoll.ppermute(v, "z", []), lambda v: jaxcoll.broadcast(v, "z")])
def test_an_unknown_axis_name_is_a_name_error(call):
    with pytest.raises(NameError, match="axis_name="):
        trace(call)


def test_collectives_outside_shard_map_are_a_name_error():
    with pytest.raises(NameError, match="'i'"):
        jax.jit(lambda v: jaxcoll.all_reduce(v, "i")).trace(jnp.zeros(3))


@pytest.mark.parametrize("call,match", [
    (lambda v: jaxcoll.reduce_scatter(v, "y", scatter_dimension=0, tiled=True), r"scatter_dimension=0.* 6 .*4"),
    (lambda v: jaxcoll.reduce_scatter(v, "y"), r"scatter_dimension=0.* 6 .*group size 4"),
    (lambda v: jaxcoll.all_to_all(v, "y", 0, 1, tiled=True), r"split_axis=0.* 6 .*4"),
    (lambda v: jaxcoll.all_to_all(v, "y", 1, 0), r"split_axis=1.* 5 .*4"),
    (lambda v: jaxcoll.all_gather(v, "y", axis=2, tiled=True), r"axis=2"),
    (lambda v: jaxcoll.all_gather(v, "y", axis=3), r"axis=3"),
    (lambda v: jaxcoll.reduce_scatter(v, "y", scatter_dimension=-3, tiled=True), r"scatter_dimension=-3"),
])
def test_a_dimension_that_does_not_fit_the_group_is_a_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        trace(call, shape=(8, 6, 5))


@pytest.mark.parametrize("perm,match", [
    ([(0, 1), (0, 2)], r"repeats source rank\(s\) \[0\]"),
    ([(0, 1), (2, 1)], r"repeats destination rank\(s\) \[1\]"),
    ([(0, 4)], r"\(0, 4\) outside the group of 4"),
    ([(-1, 0)], r"\(-1, 0\) outside"),
    ([(0, 1, 2)], r"perm="),
])
def test_a_bad_permutation_is_a_value_error(perm, match):
    with pytest.raises(ValueError, match=match):
        trace(lambda v: jaxcoll.ppermute(v, "y", perm))


@pytest.mark.parametrize("root", [-1, 4, 1.5, None])
def test_a_root_outside_the_group_is_a_value_error(root):
    with pytest.raises(ValueError, match=f"root={root!r}"):
        trace(lambda v: jaxcoll.broadcast(v, "y", root=root))


@pytest.mark.parametrize("call", [lambda v: jaxcoll.all_reduce(v, "y", op="prod"),
                                  lambda v: jaxcoll.reduce_scatter(v, "y", op="mean", tiled=True)])
def test_an_unknown_reduction_is_a_value_error(call):
    with pytest.raises(ValueError, match=r"op='(prod|mean)'.*'sum', 'max', 'min'"):
        trace(call)


@pytest.mark.parametrize("dtype", [jnp.complex64, jnp.int16, jnp.uint16, jnp.float8_e4m3fn])
def test_an_unsupported_dtype_is_a_type_error_naming_it(dtype):
    name = np.dtype(dtype).name
    for call in (lambda v: jaxcoll.all_reduce(v, "y"), lambda v: jaxcoll.all_gather(v, "y")):
        with pytest.raises(TypeError, match=f"dtype={name}"):
            trace(call, dtype=dtype)


def test_bool_sums_are_a_type_error():
    with pytest.raises(TypeError, match="dtype=bool.*op='sum'"):
        trace(lambda v: jaxcoll.all_reduce(v, "y"), dtype=jnp.bool_)


def test_an_unknown_algorithm_is_a_value_error_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"algorithm='fastest'.*'auto'.*'direct'.*'ring'"):
        trace(lambda v: jaxcoll.all_reduce(v, "y", algorithm="fastest"))


def test_a_plan_for_another_collective_or_group_size_is_a_value_error():
    with pytest.raises(ValueError, match="all_gather plan.*all_reduce"):
        trace(lambda v: jaxcoll.all_reduce(v, "y", algorithm=builtin(Collective.ALL_GATHER, "direct", 4)))
    with pytest.raises(ValueError, match="nranks=8.*4 ranks"):
        trace(lambda v: jaxcoll.all_reduce(v, "y", algorithm=builtin(Collective.ALL_REDUCE, "direct", 8)))
