"""jax's own collective test cases, run through jaxcoll.replace_collectives.

A representative set, written here (not copied) after the cases of jax's test suite (github.com/jax-ml/jax):
- tests/pmap_test.py, PythonPmapTest: testBasic, testMean, testGather, testGatherBool, testGatherTiled,
  testReduceScatter, testReduceScatterTiled, testReduceScatterReplicaGroupsTiled, testTrees,
  testCollectivesWithTreesOfDifferentDtypes, testComplexPsum, testAllToAll (split/concat 0..1); jax.pmap is a
  shard_map in the traced program on the supported JAX releases, so the transform reaches it (testNestedBasic
  is left out: a pmap of a pmap fails in jax 0.10.2 itself, with a mesh mismatch);
- tests/shard_map_test.py, ShardMapTest: test_all_gather, test_all_gather_invariant_basic,
  test_matmul_reduce_scatter, test_collective_permute, test_collective_permute_with_multiple_axis_names,
  test_all_to_all (one axis, two axes), test_all_to_all_grad, test_pbroadcast (GPU-only in jax: XLA:CPU has no
  lowering for it; jaxcoll runs it here);
- tests/batching_test.py, BatchingTest: testPPermute (random permutations over a vmap axis), testAllToAll
  (split/concat/vmap positions): collectives over vmap axes, the transform applied inside the vmap.
Their shapes, dtypes, axes and expected values (numpy closed forms) are jax's; where jax's case uses
axis_index_groups or a dtype the runtime lacks (complex64), the transform leaves that collective to XLA with a
warning and the value is still checked.
"""

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxcoll.replace import ReplacementWarning, replace_collectives

N = 8  # jax's pmap tests use jax.device_count(); the suite runs on 8 CPU devices


def pmap(f, axis_name="i"):
    return replace_collectives(jax.pmap(f, axis_name=axis_name))


def _fully_replaced(transformed):
    report = transformed.report
    assert report.entries and not report.left_to_xla, report


# -- tests/pmap_test.py -------------------------------------------------------------------------------------------

def test_pmap_basic_psum():
    x = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    f = pmap(lambda v: v - lax.psum(v, "i"))
    np.testing.assert_array_equal(f(x), x - x.sum(0))
    _fully_replaced(f)


def test_pmap_mean():
    x = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    np.testing.assert_allclose(pmap(lambda v: v - lax.pmean(v, "i"))(x), x - x.mean(0), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.bool_])
def test_pmap_gather(dtype):
    x = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    x = (x % 2).astype(dtype) if dtype == np.bool_ else x
    f = pmap(lambda v: lax.all_gather(v, "i"))
    np.testing.assert_array_equal(f(x), np.array([x] * N))
    _fully_replaced(f)


def test_pmap_gather_tiled():
    x = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    np.testing.assert_array_equal(pmap(lambda v: lax.all_gather(v, "i", tiled=True))(x),
                                  np.array([x] * N).reshape(N, -1))


def test_pmap_reduce_scatter():
    x = np.arange(N * N, dtype=np.float32).reshape(N, N)
    f = pmap(lambda v: lax.psum_scatter(v, "i"))
    np.testing.assert_array_equal(f(x), x.sum(0))
    _fully_replaced(f)


def test_pmap_reduce_scatter_tiled():
    x = np.arange(N * 4 * N, dtype=np.float32).reshape(N, 4 * N)
    np.testing.assert_array_equal(pmap(lambda v: lax.psum_scatter(v, "i", tiled=True))(x),
                                  x.sum(0).reshape(N, 4))


def test_pmap_reduce_scatter_with_replica_groups_falls_back_to_xla():
    groups = [[i for i in range(N) if i % 2 == 0], [i for i in range(N) if i % 2]]
    x = np.arange(N * 4 * N, dtype=np.float32).reshape(N, 4 * N)
    f = pmap(lambda v: lax.psum_scatter(v, "i", axis_index_groups=groups, tiled=True))
    with pytest.warns(ReplacementWarning, match="axis_index_groups"):
        got = f(x)
    sums = [x[0::2].sum(0), x[1::2].sum(0)]
    part = 4 * N // (N // 2)
    for i, row in enumerate(got):
        np.testing.assert_array_equal(row, sums[i % 2][i // 2 * part:(i // 2 + 1) * part])


def test_pmap_trees():
    x = {k: np.arange(o * N * N, (o + 1) * N * N).reshape(N, N).astype(np.int32)
         for k, o in (("a", 1), ("b", 2), ("c", 4))}
    rotate = lambda v, a: lax.ppermute(v, a, [(i, (i + 1) % N) for i in range(N)])  # noqa: E731
    for collective, expected in [
            (lax.pmax, lambda v: np.broadcast_to(v.max(0), v.shape)),
            (lax.pmin, lambda v: np.broadcast_to(v.min(0), v.shape)),
            (lax.psum, lambda v: np.broadcast_to(v.sum(0), v.shape)),
            (lambda v, a: lax.all_to_all(v, a, 0, 0), np.transpose),
            (rotate, lambda v: np.concatenate([v[-1:], v[:-1]]))]:
        f = pmap(lambda v: collective(v, "i"))
        jax.tree.map(np.testing.assert_array_equal, f(x), jax.tree.map(expected, x))
        _fully_replaced(f)


def test_pmap_collectives_with_trees_of_different_dtypes():
    x = {"a": np.arange(N * N, dtype=np.float32).reshape(N, N), "b": np.arange(N * N, dtype=np.int32).reshape(N, N)}
    for collective, reduce in ((lax.pmax, np.max), (lax.pmin, np.min), (lax.psum, np.sum)):
        got = pmap(lambda v: collective(v, "i"))(x)
        jax.tree.map(np.testing.assert_array_equal, got,
                     jax.tree.map(lambda v: np.broadcast_to(reduce(v, 0), v.shape), x))
    got = pmap(lambda v: lax.pmean(v, "i"))(x)
    jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-6), got,
                 jax.tree.map(lambda v: np.broadcast_to(np.mean(v, 0), v.shape), x))


def test_pmap_complex_psum_falls_back_to_xla():
    x = np.arange(N * 8, dtype=np.float32).reshape(N, 8).view(np.complex64)
    f = pmap(lambda v: v - lax.psum(v, "i"))
    with pytest.warns(ReplacementWarning, match="dtype='complex64'"):
        got = f(x)
    np.testing.assert_array_equal(got, x - x.sum(0))


@pytest.mark.parametrize("split_axis,concat_axis", list(itertools.product(range(2), range(2))))
def test_pmap_all_to_all(split_axis, concat_axis):
    x = np.arange(N ** 3).reshape(N, N, N).astype(np.float32)
    f = pmap(lambda v: lax.all_to_all(v, "i", split_axis, concat_axis))
    np.testing.assert_array_equal(f(x), np.moveaxis(x, (0, split_axis + 1), (concat_axis + 1, 0)))
    _fully_replaced(f)


# -- tests/shard_map_test.py --------------------------------------------------------------------------------------

def _mesh(shape, names):
    # Automatic axes, as jax's test meshes (jtu.create_mesh): inputs need not be placed before shard_map.
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names),
                         devices=jax.devices()[:int(np.prod(shape))])


def _inputs(spec, mesh, dtype=np.float32):
    return jax.device_put(np.arange(64, dtype=dtype).reshape(8, 8), NamedSharding(mesh, spec))


def test_shard_map_all_gather():
    mesh = _mesh((2, 2, 2), ("x", "y", "z"))
    a = _inputs(P("z", ("x", "y")), mesh)
    f = replace_collectives(jax.jit(jax.shard_map(
        lambda v: (lax.all_gather(v, "z", axis=0, tiled=True), lax.all_gather(v, ("x", "y"), axis=-1, tiled=True)),
        mesh=mesh, in_specs=P("z", ("x", "y")), out_specs=P("z", ("x", "y")))))
    c, d = f(a)
    for i, block in enumerate(np.split(np.asarray(a), 4, axis=1)):
        np.testing.assert_array_equal(c.addressable_data(2 * i), block)
    for i, block in enumerate(np.split(np.asarray(a), 2, axis=0)):
        np.testing.assert_array_equal(d.addressable_data(i), block)
    _fully_replaced(f)


def test_shard_map_all_gather_invariant_and_its_grad():
    mesh = _mesh((4,), ("x",))
    f = jax.shard_map(lambda v: lax.all_gather(v, "x", tiled=True, to="invarying"), mesh=mesh, in_specs=P("x"),
                      out_specs=P())
    g = replace_collectives(f)
    a = jnp.arange(8.0)
    np.testing.assert_array_equal(jax.jit(g)(a), a)
    weights = jnp.arange(8.0) + 1
    grad = jax.jit(jax.grad(lambda v: (g(v) * weights).sum()))(a)
    np.testing.assert_array_equal(grad, weights)  # d/dv sum(w * v) = w: each rank's slice of it
    _fully_replaced(g)


def test_shard_map_matmul_reduce_scatter():
    mesh = _mesh((2, 2, 2), ("x", "y", "z"))
    a, b = _inputs(P("z", "y"), mesh), _inputs(P("y", None), mesh)
    f = replace_collectives(jax.jit(jax.shard_map(
        lambda u, v: (lax.psum_scatter(u @ v, "y", scatter_dimension=0, tiled=True),
                      lax.psum_scatter(u @ v, ("z", "y"), scatter_dimension=0, tiled=True)),
        mesh=mesh, in_specs=(P("z", "y"), P("y", None)), out_specs=P(("z", "y"), None))))
    c, d = f(a, b)
    expected = np.asarray(a) @ np.asarray(b)
    np.testing.assert_array_equal(c, expected)
    np.testing.assert_array_equal(d, expected[:4] + expected[4:])


def test_shard_map_collective_permute():
    mesh = _mesh((8,), ("x",))
    a = jax.device_put(np.arange(64).reshape(8, 8).astype(np.int32), NamedSharding(mesh, P("x", None)))

    def shift(v):
        n = lax.axis_size("x")
        return lax.ppermute(v, "x", perm=[(j, (j + 1) % n) for j in range(n)])
    c = replace_collectives(jax.jit(jax.shard_map(shift, mesh=mesh, in_specs=P("x", None), out_specs=P("x", None))))(a)
    np.testing.assert_array_equal(c, np.roll(np.asarray(a), 1, axis=0))


def test_shard_map_collective_permute_with_multiple_axis_names():
    mesh = _mesh((2, 2, 2), ("x", "y", "z"))
    a = jax.device_put(np.arange(64).reshape(4, 16).astype(np.int32), NamedSharding(mesh, P("x", ("y", "z"))))

    def f(v):
        xy, yz = lax.axis_size(("x", "y")), lax.axis_size(("y", "z"))
        return (lax.ppermute(v, ("x", "y"), perm=[(j, (j + 1) % xy) for j in range(xy)]),
                lax.ppermute(v, ("y", "z"), perm=[(j, (j + 1) % yz) for j in range(yz)]))
    c, d = replace_collectives(jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x", ("y", "z")),
                                                     out_specs=P("x", ("y", "z")))))(a)
    for i in range(8):
        np.testing.assert_array_equal(a.addressable_data(i), c.addressable_data((i + 2) % 8))
        np.testing.assert_array_equal(a.addressable_data(i), d.addressable_data(4 * (i // 4) + (i + 1) % 4))


@pytest.mark.parametrize("axis_name,mesh_axes", [("x", {"x": 8}), (("x", "y"), {"x": 4, "y": 2})])
def test_shard_map_all_to_all(axis_name, mesh_axes):
    mesh = _mesh(tuple(mesh_axes.values()), tuple(mesh_axes))
    a = jax.device_put(np.arange(64).reshape(8, 8).astype(np.float32), NamedSharding(mesh, P(axis_name, None)))
    f = replace_collectives(jax.jit(jax.shard_map(
        lambda v: lax.all_to_all(v, axis_name, split_axis=1, concat_axis=1, tiled=True),
        mesh=mesh, in_specs=P(axis_name, None), out_specs=P(None, axis_name))))
    np.testing.assert_array_equal(f(a), np.asarray(a).T.reshape(1, 64))
    _fully_replaced(f)


def test_shard_map_all_to_all_grad():
    mesh = _mesh((4,), ("x",))
    a = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), NamedSharding(mesh, P("x", None)))
    fwd = replace_collectives(jax.shard_map(lambda v: lax.all_to_all(v, "x", split_axis=1, concat_axis=0, tiled=True),
                                            mesh=mesh, in_specs=P("x", None), out_specs=P(None, "x")))
    np.testing.assert_array_equal(jax.jit(fwd)(a), a)
    loss, grad = jax.jit(jax.value_and_grad(lambda v: fwd(v).sum() * 2))(a)
    assert loss == 2 * sum(range(64))
    np.testing.assert_array_equal(grad, 2 * np.ones((8, 8), np.float32))


@pytest.mark.parametrize("replicate_on_axes", ["x", ("x", "y")])
def test_shard_map_pbroadcast(replicate_on_axes):
    mesh = _mesh((4, 2), ("x", "y"))
    sharded = [a for a in mesh.axis_names if a not in replicate_on_axes] or None
    spec = P(sharded, None)
    a = jax.device_put(np.arange(16).reshape(4, 4).astype(np.float32), NamedSharding(mesh, spec))

    def fwd(v):
        v = jnp.where(lax.axis_index(replicate_on_axes) == 0, v + 1, v)
        return lax.pbroadcast(v, replicate_on_axes, source=0)
    f = replace_collectives(jax.jit(jax.shard_map(fwd, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)))
    np.testing.assert_array_equal(f(a), np.asarray(a) + 1)
    _fully_replaced(f)


# -- tests/batching_test.py: collectives over vmap axes -----------------------------------------------------------

def test_vmap_ppermute_random_permutations():
    n = 10
    x = np.arange(n, dtype=np.float32)
    rng = np.random.default_rng(0)
    for _ in range(5):
        perm = rng.permutation(n)
        pairs = np.stack([np.arange(n), perm], axis=-1)
        rng.shuffle(pairs)
        pairs = [tuple(p) for p in pairs.tolist()]  # jax 0.12's ppermute takes a list, not an array
        got = jax.vmap(replace_collectives(lambda v: v - lax.ppermute(v, "i", pairs)), axis_name="i")(x)
        np.testing.assert_array_equal(got, x - x[np.argsort(perm)])


@pytest.mark.parametrize("split_axis,concat_axis,vmap_axis", [(0, 0, 0), (0, 2, 1), (1, 0, 3), (2, 1, 2)])
def test_vmap_all_to_all(split_axis, concat_axis, vmap_axis):
    x = np.arange(4 ** 4, dtype=np.float32).reshape(4, 4, 4, 4)
    f = jax.vmap(replace_collectives(lambda v: lax.all_to_all(v, "i", split_axis, concat_axis)), in_axes=vmap_axis,
                 axis_name="i")
    expected = np.moveaxis(x, (vmap_axis, split_axis + (vmap_axis <= split_axis)), (concat_axis + 1, 0))
    np.testing.assert_array_equal(f(x), expected)
