"""Property-based: on random meshes, axes, dtypes and shapes, jaxcoll's collectives equal jax.lax's (exactly for
integers, max and min; to rounding for float sums). Few examples: each one compiles two programs."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st
from jax import lax

import jaxcoll
from sharded import MESH_AXES, group_size, mesh, per_rank, put, sharded

SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FLOATS = [np.float32, jnp.bfloat16, np.float16]
INTS = [np.int8, np.int32, np.uint8, np.uint32]


def random_input(mesh_name, shape, dtype, seed):
    rng = np.random.default_rng(seed)
    r = mesh(mesh_name).devices.size
    if np.dtype(dtype).kind == "f":
        data = rng.standard_normal((r, *shape))
    else:
        data = rng.integers(0, 100, (r, *shape))
    return put(data.astype(dtype), mesh_name)


def close(got, want, dtype, n):
    g, w = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    if np.dtype(dtype).kind != "f":
        np.testing.assert_array_equal(g, w)
    else:
        tol = 1e-5 if np.dtype(dtype) == np.float32 else 3e-2
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * n)


@SETTINGS
@given(case=st.sampled_from(MESH_AXES), dtype=st.sampled_from(FLOATS + INTS), op=st.sampled_from(["sum", "max", "min"]),
       shape=st.lists(st.integers(1, 5), min_size=0, max_size=3), seed=st.integers(0, 2**16))
def test_all_reduce_equals_lax(case, dtype, op, shape, seed):
    mesh_name, axis_name = case
    x = random_input(mesh_name, tuple(shape), dtype, seed)
    ref = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[op]
    got = sharded(per_rank(lambda v: jaxcoll.all_reduce(v, axis_name, op=op)), mesh_name)(x)
    want = sharded(per_rank(lambda v: ref(v, axis_name)), mesh_name)(x)
    close(got, want, dtype if op == "sum" else np.int32, group_size(mesh_name, axis_name))


@SETTINGS
@given(case=st.sampled_from(MESH_AXES), dtype=st.sampled_from(FLOATS + INTS), data=st.data(), seed=st.integers(0, 2**16))
def test_reduce_scatter_then_all_gather_equals_lax(case, dtype, data, seed):
    mesh_name, axis_name = case
    n = group_size(mesh_name, axis_name)
    shape = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    dim = data.draw(st.integers(0, len(shape) - 1))
    shape[dim] *= n
    x = random_input(mesh_name, tuple(shape), dtype, seed)

    def run(rs, ag):
        return lambda v: ag(rs(v, axis_name, scatter_dimension=dim, tiled=True), axis_name, axis=dim, tiled=True)
    got = sharded(per_rank(run(jaxcoll.reduce_scatter, jaxcoll.all_gather)), mesh_name)(x)
    want = sharded(per_rank(run(lax.psum_scatter, lax.all_gather)), mesh_name)(x)
    close(got, want, dtype, n)
