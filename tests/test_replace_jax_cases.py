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
  (split/concat/vmap positions): collectives over vmap axes, the transform applied inside the vmap;
- axis_index_groups on every collective that takes them (pmap_test.py's ReplicaGroups cases, and groups of every
  shape), with the errors for groups that do not split the axis;
- tests/ragged_collective_test.py, RaggedCollectiveTest (XLA:CPU cannot run it: against the lax contract in
  numpy);
- shard_map_test.py's reduced/unreduced cases (an FSDP gradient among them), on the JAX releases that have them.
Their shapes, dtypes, axes and expected values (numpy closed forms) are jax's; where jax's case uses a dtype the
runtime lacks (complex64), the transform leaves that collective to XLA with a warning and the value is still
checked. The later sections also compare each result with the untransformed program, where XLA:CPU runs it.
"""

import itertools
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxcoll import _jax
from jaxcoll.replace import ReplacementError, ReplacementWarning, replace_collectives
from replace_cases import jaxcoll_calls, xla_collectives

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


def test_pmap_reduce_scatter_with_replica_groups():
    groups = [[i for i in range(N) if i % 2 == 0], [i for i in range(N) if i % 2]]
    x = np.arange(N * 4 * N, dtype=np.float32).reshape(N, 4 * N)
    f = pmap(lambda v: lax.psum_scatter(v, "i", axis_index_groups=groups, tiled=True))
    got = f(x)
    sums = [x[0::2].sum(0), x[1::2].sum(0)]
    part = 4 * N // (N // 2)
    for i, row in enumerate(got):
        np.testing.assert_array_equal(row, sums[i % 2][i // 2 * part:(i // 2 + 1) * part])
    _fully_replaced(f)


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


# -- axis_index_groups: each group its own communicator ------------------------------------------------------------
# After jax's replica-group cases (pmap_test.py testPsumReplicaGroups, testGatherReplicaGroups,
# testReduceScatterReplicaGroups, testAllToAllReplicaGroup), with groups of every shape: contiguous, strided
# (not contiguous in the mesh), listed out of order, over a tuple of axes; each result compared with the
# untransformed program (XLA's replica groups) and with numpy.

GROUPS = {
    "halves": [[0, 1, 2, 3], [4, 5, 6, 7]],
    "strided": [[0, 2, 4, 6], [1, 3, 5, 7]],
    "pairs_out_of_order": [[5, 1], [0, 7], [6, 2], [3, 4]],
    "one_group": [list(range(8))],
}


def _members(groups, i):
    """(the group of axis index i, i's position in it)."""
    for g in groups:
        if i in g:
            return g, g.index(i)


def _same_as_xla(f, *args):
    """f's results through replace_collectives, equal to the untransformed program's, with nothing left to XLA."""
    expected = jax.jit(f)(*args)
    g = replace_collectives(f)
    got = jax.jit(g)(*args)
    jax.tree.map(np.testing.assert_array_equal, got, expected)
    _fully_replaced(g)
    return got


@pytest.mark.parametrize("groups", GROUPS.values(), ids=GROUPS.keys())
@pytest.mark.parametrize("collective", ["psum", "pmax", "pmin"])
def test_pmap_reductions_over_index_groups(groups, collective):
    x = np.arange(N * 3, dtype=np.float32).reshape(N, 3) % 5
    reduce = {"psum": np.sum, "pmax": np.max, "pmin": np.min}[collective]
    got = _same_as_xla(jax.pmap(lambda v: getattr(lax, collective)(v, "i", axis_index_groups=groups),
                                axis_name="i"), x)
    for i in range(N):
        np.testing.assert_array_equal(got[i], reduce(x[_members(groups, i)[0]], axis=0))


@pytest.mark.parametrize("groups", GROUPS.values(), ids=GROUPS.keys())
@pytest.mark.parametrize("tiled", [False, True])
def test_pmap_all_gather_over_index_groups(groups, tiled):
    x = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    got = _same_as_xla(jax.pmap(lambda v: lax.all_gather(v, "i", axis_index_groups=groups, tiled=tiled),
                                axis_name="i"), x)
    for i in range(N):
        gathered = x[_members(groups, i)[0]]
        np.testing.assert_array_equal(got[i], gathered.reshape(-1) if tiled else gathered)


@pytest.mark.parametrize("groups", GROUPS.values(), ids=GROUPS.keys())
def test_pmap_psum_scatter_over_index_groups(groups):
    k = len(groups[0])
    x = np.arange(N * k * 2, dtype=np.float32).reshape(N, k, 2)
    got = _same_as_xla(jax.pmap(lambda v: lax.psum_scatter(v, "i", axis_index_groups=groups), axis_name="i"), x)
    for i in range(N):
        members, position = _members(groups, i)
        np.testing.assert_array_equal(got[i], x[members].sum(0)[position])


@pytest.mark.parametrize("groups", GROUPS.values(), ids=GROUPS.keys())
def test_pmap_all_to_all_over_index_groups(groups):
    k = len(groups[0])
    x = np.arange(N * k * 2, dtype=np.float32).reshape(N, k, 2)
    got = _same_as_xla(jax.pmap(lambda v: lax.all_to_all(v, "i", 0, 0, axis_index_groups=groups),
                                axis_name="i"), x)
    for i in range(N):
        members, position = _members(groups, i)
        np.testing.assert_array_equal(got[i], x[members][:, position])


@pytest.mark.parametrize("axis_name,groups", [("y", [[0, 3], [2, 1]]), (("x", "y"), [[0, 5, 2, 7], [4, 1, 6, 3]])])
def test_shard_map_collectives_over_index_groups_of_one_axis_and_of_a_tuple(axis_name, groups):
    # Over "y" the groups repeat for each x; over ("x", "y") they index the linearized pair, here two groups
    # that cross both axes.
    mesh = _mesh((2, 4), ("x", "y"))
    a = jax.device_put(np.arange(8 * 8, dtype=np.float32).reshape(8, 8), NamedSharding(mesh, P(("x", "y"))))
    k = len(groups[0])

    def body(v):
        return (lax.all_gather(v, axis_name, axis_index_groups=groups, axis=1, tiled=True),
                lax.psum_scatter(v, axis_name, axis_index_groups=groups, scatter_dimension=1, tiled=True),
                lax.all_to_all(v, axis_name, 1, 1, axis_index_groups=groups, tiled=True),
                lax.pmax(v, axis_name, axis_index_groups=groups))
    f = jax.shard_map(body, mesh=mesh, in_specs=P(("x", "y")), out_specs=P(("x", "y")), check_vma=False)
    gathered, scattered, exchanged, largest = _same_as_xla(f, a)
    blocks = np.asarray(a).reshape(8, 1, 8)
    for d in range(8):  # device d = (x, y) in row-major order
        index = d if isinstance(axis_name, tuple) else d % 4
        members, position = _members(groups, index)
        peers = [d - index + m for m in members]
        np.testing.assert_array_equal(gathered[d], np.concatenate(list(blocks[peers, 0]), axis=0))
        np.testing.assert_array_equal(scattered[d], np.split(blocks[peers, 0].sum(0), k)[position])
        np.testing.assert_array_equal(exchanged[d], np.concatenate(
            [np.split(blocks[p, 0], k)[position] for p in peers]))
        np.testing.assert_array_equal(largest[d], blocks[peers, 0].max(0))


def test_all_gather_over_index_groups_and_its_gradient_under_check_vma():
    mesh = _mesh((8,), ("x",))
    groups = GROUPS["strided"]
    f = jax.shard_map(lambda v: lax.all_gather(v, "x", axis_index_groups=groups, tiled=True),
                      mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    a = jnp.arange(16.0)
    weights = jnp.arange(16.0 * 4).reshape(-1) % 7
    loss = lambda g: lambda v: (g(v) * weights).sum()  # noqa: E731
    expected = jax.jit(jax.value_and_grad(loss(f)))(a)
    g = replace_collectives(f)
    got = jax.jit(jax.value_and_grad(loss(g)))(a)
    jax.tree.map(np.testing.assert_array_equal, got, expected)
    _fully_replaced(g)


def test_the_plan_is_chosen_for_the_group_size(monkeypatch):
    # One plan per call site serves every group: "auto" (the tuner's choice, else the model's) picks it for the
    # group's size (4), not the axis's (8).
    from jaxcoll.lowering import call_plan
    seen = []
    choose = call_plan.choose

    def spy(api_name, collective, nranks, *args, **kw):
        seen.append(nranks)
        return choose(api_name, collective, nranks, *args, **kw)
    monkeypatch.setattr(call_plan, "choose", spy)
    x = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    pmap(lambda v: lax.psum(v, "i", axis_index_groups=GROUPS["strided"]))(x)
    assert seen and set(seen) == {4}


@pytest.mark.parametrize("groups,problem", [
    ([[0, 1, 2], [3, 4, 5, 6, 7]], "unequal sizes"),
    ([[0, 1], [2, 3]], "does not cover"),
    ([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], "outside"),
])
@pytest.mark.parametrize("collective", ["psum", "all_gather", "psum_scatter", "all_to_all"])
def test_bad_index_groups_fail_while_tracing_naming_the_argument_and_value(groups, problem, collective):
    call = {"psum": lambda v: lax.psum(v, "i", axis_index_groups=groups),
            "all_gather": lambda v: lax.all_gather(v, "i", axis_index_groups=groups),
            "psum_scatter": lambda v: lax.psum_scatter(v, "i", axis_index_groups=groups, tiled=True),
            "all_to_all": lambda v: lax.all_to_all(v, "i", 0, 0, axis_index_groups=groups, tiled=True)}[collective]
    f = replace_collectives(jax.pmap(call, axis_name="i"))
    value = re.escape(repr(tuple(map(tuple, groups))))
    with pytest.raises(ValueError, match=rf"axis_index_groups={value} .*{problem}"):
        jax.make_jaxpr(f)(np.zeros((N, 60), np.float32))


def test_overlapping_index_groups_fail_with_lax_s_error():
    # lax checks this one itself, while the program is traced, before the transform sees the call.
    f = replace_collectives(jax.pmap(lambda v: lax.psum(v, "i", axis_index_groups=[[0, 1, 2, 3], [3, 4, 5, 6]]),
                                     axis_name="i"))
    with pytest.raises(ValueError, match="axis_index_groups must cover all indices exactly once"):
        jax.make_jaxpr(f)(np.zeros((N, 4), np.float32))


# -- tests/ragged_collective_test.py: lax.ragged_all_to_all ------------------------------------------------------
# After jax's RaggedCollectiveTest (test_ragged_all_to_all, _grad, _axis_index_groups, _degenerate_groups,
# _vmap_multi_dim_operand), which XLA:CPU cannot run (it has no ragged-all-to-all): the reference is the lax
# contract in numpy (`ragged_reference`), and the untransformed program is only traced.

def ragged_reference(operand, output, input_offsets, send_sizes, output_offsets, groups):
    """lax.ragged_all_to_all on every rank at once: argument[r] is rank r's; `groups` lists each group's ranks in
    group order. Slice i of rank `src` goes to rank group[i // s] (s slices per destination), at its offset
    there. Written with static slices of jnp arrays, so jax.grad differentiates it."""
    result = jnp.asarray(output)
    for group in groups:
        per_destination = len(input_offsets[0]) // len(group)
        for src in group:
            for i in range(len(input_offsets[0])):
                size, start, at = int(send_sizes[src][i]), int(input_offsets[src][i]), int(output_offsets[src][i])
                result = result.at[group[i // per_destination], at:at + size].set(operand[src, start:start + size])
    return result


def _ragged_program(mesh, axis_name, check_vma=False, **kw):
    spec = P(axis_name)

    def body(operand, output, *slices):
        return lax.ragged_all_to_all(operand[0], output[0], *(s[0] for s in slices), axis_name=axis_name, **kw)[None]
    return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 6, out_specs=spec, check_vma=check_vma)


def _ragged_arguments(rng, n, rows, out_rows, per_destination=1, tail=(), dtype=np.float32):
    """Random slices for a group of n ranks: rank r sends sizes[r, i] rows from its operand (packed, with gaps)
    to rank i // per_destination, which places them one after the other from a random start, leaving gaps."""
    k = n * per_destination
    sizes = rng.integers(0, 3, (n, k)).astype(np.int32)
    gaps = rng.integers(0, 2, (n, k)).astype(np.int32)
    input_offsets = np.cumsum(sizes + gaps, axis=1) - sizes - gaps
    assert (input_offsets + sizes).max() <= rows
    output_offsets = np.zeros((n, k), np.int32)
    for d in range(n):  # receiver d takes the slices i of each sender in order (sender, then slot)
        at = int(rng.integers(0, 2))
        for src in range(n):
            for i in range(d * per_destination, (d + 1) * per_destination):
                output_offsets[src, i] = at
                at += sizes[src, i]
        assert at <= out_rows
    recv_sizes = np.stack([sizes[:, d * per_destination:(d + 1) * per_destination].reshape(-1) for d in range(n)])
    operand = (rng.integers(1, 100, (n, rows, *tail))).astype(dtype)
    output = np.full((n, out_rows, *tail), -1, dtype)
    return operand, output, input_offsets.astype(np.int32), sizes, output_offsets, recv_sizes.astype(np.int32)


def _put(mesh, axis_name, arrays):
    return [jax.device_put(a, NamedSharding(mesh, P(axis_name))) for a in arrays]


def test_ragged_all_to_all_lax_docstring_example():
    mesh = _mesh((2,), ("x",))
    arguments = (np.array([[1, 2, 2], [3, 4, 0]], np.int32), np.zeros((2, 4), np.int32),
                 np.array([[0, 1], [0, 1]], np.int32), np.array([[1, 2], [1, 1]], np.int32),
                 np.array([[0, 0], [1, 2]], np.int32), np.array([[1, 1], [2, 1]], np.int32))
    f = replace_collectives(jax.jit(_ragged_program(mesh, "x")))
    np.testing.assert_array_equal(f(*_put(mesh, "x", arguments)), [[1, 3, 0, 0], [2, 2, 4, 0]])
    _fully_replaced(f)


@pytest.mark.parametrize("n,per_destination,tail,dtype", [
    (4, 1, (), np.float32), (8, 1, (3,), np.int32), (4, 2, (2, 3), np.float32), (8, 3, (), np.bool_)])
@pytest.mark.parametrize("check_vma", [False, True])
def test_ragged_all_to_all_writes_every_slice_and_leaves_the_rest_of_output(n, per_destination, tail, dtype,
                                                                            check_vma):
    mesh = _mesh((n,), ("x",))
    arguments = _ragged_arguments(np.random.default_rng(n * per_destination), n, 4 * n * per_destination,
                                  3 * n * per_destination + 1, per_destination, tail, dtype)
    program = _ragged_program(mesh, "x", check_vma=check_vma)
    f = replace_collectives(jax.jit(program))
    got = f(*_put(mesh, "x", arguments))
    np.testing.assert_array_equal(got, ragged_reference(*arguments[:5], [list(range(n))]).astype(dtype))
    _fully_replaced(f)


@pytest.mark.parametrize("groups", [((0, 1), (2, 3)), ((3, 0), (2, 1)), ((0,), (1,), (2,), (3,))])
def test_ragged_all_to_all_over_index_groups(groups):
    mesh = _mesh((4,), ("x",))
    k = len(groups[0])
    rng = np.random.default_rng(len(groups))
    arguments = [np.zeros((4,) + shape, dtype) for shape, dtype in
                 (((12,), np.float32), ((9,), np.float32), *(((k,), np.int32),) * 4)]
    for group in groups:  # each group exchanges as a group of its own, ranks numbered in the group's order
        for position, parts in zip(group, zip(*_ragged_arguments(rng, k, 12, 9))):
            for argument, part in zip(arguments, parts):
                argument[position] = part
    f = replace_collectives(jax.jit(_ragged_program(mesh, "x", axis_index_groups=groups)))
    got = f(*_put(mesh, "x", arguments))
    np.testing.assert_array_equal(got, ragged_reference(*arguments[:5], [list(g) for g in groups]))
    _fully_replaced(f)


def test_ragged_all_to_all_gradient_is_the_reference_s():
    mesh = _mesh((4,), ("x",))
    arguments = _ragged_arguments(np.random.default_rng(7), 4, 16, 13, tail=(2,))
    operand, output, *slices = _put(mesh, "x", arguments)
    weights = np.random.default_rng(8).normal(size=output.shape).astype(np.float32)
    f = replace_collectives(_ragged_program(mesh, "x"))
    loss = lambda a, o: (jnp.sin(f(a, o, *slices)) * weights).sum()  # noqa: E731

    def reference(a, o):
        return (jnp.sin(ragged_reference(a, o, *arguments[2:5], [list(range(4))])) * weights).sum()
    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(operand, output)
    expected = jax.grad(reference, argnums=(0, 1))(arguments[0], arguments[1])
    jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-6), got, expected)
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(operand, output).compile().as_text()
    assert "all-to-all(" not in text and "ragged-all-to-all" not in text and "jaxcoll_all_to_all" in text


def test_ragged_all_to_all_under_vmap_of_the_shard_map():
    mesh = _mesh((4,), ("x",))
    rng = np.random.default_rng(3)
    batch = [_ragged_arguments(rng, 4, 16, 13) for _ in range(3)]
    stacked = [np.stack(parts, axis=1) for parts in zip(*batch)]  # the batch along dimension 1
    program = replace_collectives(_ragged_program(mesh, "x"))
    spec = NamedSharding(mesh, P("x"))
    got = jax.jit(jax.vmap(program, in_axes=1, out_axes=1))(*(jax.device_put(a, spec) for a in stacked))
    for b, arguments in enumerate(batch):
        np.testing.assert_array_equal(got[:, b], ragged_reference(*arguments[:5], [list(range(4))]))
    _fully_replaced(program)


def _body_result_type(program, *arguments):
    """The type of the shard_map body's result (under check_vma: which axes it varies over)."""
    closed = jax.make_jaxpr(program)(*arguments)
    while True:
        eqn = next(e for e in closed.jaxpr.eqns if "jaxpr" in e.params)
        if eqn.primitive.name == "shard_map":
            return eqn.params["jaxpr"].outvars[0].aval
        closed = eqn.params["jaxpr"]


def test_ragged_all_to_all_result_is_typed_as_lax_types_it():
    mesh = _mesh((2, 4), ("y", "x"))
    arguments = _put(mesh, "x", _ragged_arguments(np.random.default_rng(1), 4, 16, 13))
    program = _ragged_program(mesh, "x", check_vma=True)
    expected = _body_result_type(program, *arguments)
    assert _jax.varying_axes(expected) == {"x"}
    got = _body_result_type(replace_collectives(program), *arguments)
    assert (got, _jax.varying_axes(got)) == (expected, _jax.varying_axes(expected))


def test_ragged_all_to_all_into_an_invariant_output_stays_xla_s_naming_it():
    # lax types the result like `output`; data received from the group varies over it, which jaxcoll's result
    # says, so where output does not vary the call is left to XLA (a warning; ReplacementError when strict).
    mesh = _mesh((4,), ("x",))
    arguments = _put(mesh, "x", _ragged_arguments(np.random.default_rng(0), 4, 16, 13))

    def body(operand, *slices):
        output = jnp.zeros((13,), operand.dtype)
        return lax.ragged_all_to_all(operand[0], output, *(s[0] for s in slices), axis_name="x")
    program = jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * 5, out_specs=P())
    f = replace_collectives(program)
    with pytest.warns(ReplacementWarning, match=r"output='varying over \[\]'.*lax types like output"):
        jax.jit(f).trace(arguments[0], *arguments[2:])
    assert [e.collective for e in f.report.left_to_xla] == ["ragged_all_to_all"]
    with pytest.raises(ReplacementError, match="ragged_all_to_all.*output="):
        jax.jit(replace_collectives(program, strict=True)).trace(arguments[0], *arguments[2:])


def test_ragged_all_to_all_compiles_to_jaxcoll_in_the_block():
    from jaxcoll.replace import replacing_collectives
    mesh = _mesh((4,), ("x",))
    arguments = _ragged_arguments(np.random.default_rng(5), 4, 16, 13)
    program = jax.jit(_ragged_program(mesh, "x"))
    with replacing_collectives(strict=True) as report:
        got = program(*_put(mesh, "x", arguments))
        text = program.lower(*_put(mesh, "x", arguments)).compile().as_text()
    np.testing.assert_array_equal(got, ragged_reference(*arguments[:5], [list(range(4))]))
    assert "ragged-all-to-all" not in text and "jaxcoll_all_to_all" in text
    assert report.replaced and not report.left_to_xla


# -- jax's reduced/unreduced collectives ----------------------------------------------------------------------------
# After shard_map_test.py's unreduced cases (test_psum_reduced_input, test_shmap_unreduced_fsdp_grad,
# test_unreduced_psum_scatter_fwd_all_gather_reduced_bwd): lax.psum and lax.psum_scatter of a value unreduced over
# their axes (each rank holds a partial sum) bind unreduced_psum and unreduced_reduce_scatter, and
# lax.all_gather(..., to="reduced") binds all_gather_reduced, whose transpose is the unreduced reduce_scatter.
# Each compared with the untransformed program: values, the body's result types, gradients.

HAS_UNREDUCED = "unreduced_psum" in _jax.lax_collective_primitives()
needs_unreduced = pytest.mark.skipif(not HAS_UNREDUCED, reason="this JAX has no reduced/unreduced collectives")


def _explicit_mesh(n):
    return jax.make_mesh((n,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:n])


def _body_result_types(program, *arguments):
    """The types of the shard_map body's results (varying, unreduced and reduced axes included)."""
    closed = jax.make_jaxpr(program)(*arguments)
    eqn = next(e for e in closed.jaxpr.eqns if e.primitive.name == "shard_map")
    return [(v.aval, _jax.varying_axes(v.aval), _jax.unreduced_axes(v.aval), _jax.reduced_axes(v.aval))
            for v in eqn.params["jaxpr"].outvars]


@needs_unreduced
def test_psum_and_psum_scatter_of_unreduced_values():
    mesh = _explicit_mesh(4)

    def body(v):
        partial_sums = lax.pcast(v * 2, "x", to="unreduced")
        return lax.psum(partial_sums, "x"), lax.psum_scatter(partial_sums, "x", tiled=True)
    f = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P(), P("x")))
    x = jax.device_put(np.arange(32, dtype=np.float32), NamedSharding(mesh, P("x")))
    summed, scattered = _same_as_xla(f, x)
    np.testing.assert_array_equal(summed, 2 * np.arange(32, dtype=np.float32).reshape(4, 8).sum(0))
    np.testing.assert_array_equal(scattered, summed)
    g = replace_collectives(f)
    assert _body_result_types(g, x) == _body_result_types(f, x)
    assert {e.primitive for e in g.report.replaced} >= {"unreduced_psum", "unreduced_reduce_scatter"}


def _fsdp_loss(w, batch):
    """FSDP: the weight is stored sharded over "x" and gathered reduced for the matmul; the weight's gradient,
    unreduced, is reduce-scattered back to the shards."""
    full = lax.all_gather(w, "x", to="reduced", tiled=True)
    hidden = jnp.tanh(batch @ full)
    return lax.psum((hidden ** 2).sum(), "x")


@needs_unreduced
def test_fsdp_gradient_with_a_reduced_all_gather():
    mesh = _explicit_mesh(4)
    rng = np.random.default_rng(0)
    w = jax.device_put(rng.normal(size=(16, 3)).astype(np.float32), NamedSharding(mesh, P("x")))
    batch = jax.device_put(rng.normal(size=(8, 16)).astype(np.float32), NamedSharding(mesh, P("x")))
    loss = jax.shard_map(_fsdp_loss, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P())
    g = replace_collectives(loss)
    expected = jax.jit(jax.value_and_grad(loss))(w, batch)
    got = jax.jit(jax.value_and_grad(g))(w, batch)
    jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-6), got, expected)
    assert {e.primitive for e in g.report.replaced} >= {"all_gather_reduced", "psum_invariant"}
    _fully_replaced(g)
    text = jax.jit(jax.grad(g)).lower(w, batch).compile().as_text()
    assert xla_collectives(text) == [] and {"jaxcoll_all_gather", "jaxcoll_reduce_scatter"} <= jaxcoll_calls(text)


@needs_unreduced
def test_fsdp_gradient_in_the_block_compiles_to_jaxcoll_alone():
    from jaxcoll.replace import replacing_collectives
    mesh = _explicit_mesh(4)
    rng = np.random.default_rng(1)
    w = jax.device_put(rng.normal(size=(16, 3)).astype(np.float32), NamedSharding(mesh, P("x")))
    batch = jax.device_put(rng.normal(size=(8, 16)).astype(np.float32), NamedSharding(mesh, P("x")))
    step = jax.jit(jax.value_and_grad(jax.shard_map(_fsdp_loss, mesh=mesh, in_specs=(P("x"), P("x")),
                                                    out_specs=P())))
    expected = step(w, batch)
    with replacing_collectives(strict=True) as report:
        got = step(w, batch)
        text = step.lower(w, batch).compile().as_text()
    jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-6), got, expected)
    assert xla_collectives(text) == []
    assert {e.primitive for e in report.replaced} >= {"all_gather_reduced", "unreduced_reduce_scatter"}


@needs_unreduced
def test_psum_of_a_value_reduced_over_another_axis_and_its_gradient():
    mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    with jax.set_mesh(mesh):
        a = jax.device_put(np.arange(32.0, dtype=np.float32).reshape(8, 4), P("x", "y"))

        @jax.shard_map(out_specs=P(reduced={"y"}))
        def f(v):
            return lax.psum(jnp.sum(lax.all_gather(v, "y", axis=1, tiled=True, to="reduced")), "x")
        g = replace_collectives(f)
        np.testing.assert_array_equal(jax.jit(g)(a), jax.jit(f)(a))
        np.testing.assert_array_equal(jax.jit(jax.grad(g))(a), jax.jit(jax.grad(f))(a))
        _fully_replaced(g)
        assert xla_collectives(jax.jit(jax.grad(g)).lower(a).compile().as_text()) == []


@needs_unreduced
def test_psum_of_an_unreduced_shard_map_input_from_a_matmul():
    # The matmul's partial sums stay unreduced out of it (out_sharding), into a shard_map that sums them.
    mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:2])
    with jax.set_mesh(mesh):
        a = jax.device_put(np.arange(8.0, dtype=np.float32).reshape(2, 4), P(None, "x"))
        b = jax.device_put(np.arange(24.0, dtype=np.float32).reshape(4, 6), P("x", None))
        total = jax.shard_map(lambda z: lax.psum(z, "x"), in_specs=P(unreduced={"x"}), out_specs=P())

        def loss(reduce):
            return lambda u, v: reduce(jnp.einsum("ab,bc->ac", u, v, out_sharding=P(unreduced={"x"}))).sum()
        replaced = replace_collectives(total)
        np.testing.assert_array_equal(jax.jit(loss(replaced))(a, b), np.sum(np.asarray(a) @ np.asarray(b)))
        expected = jax.jit(jax.grad(loss(total), argnums=(0, 1)))(a, b)
        got = jax.jit(jax.grad(loss(replaced), argnums=(0, 1)))(a, b)
        jax.tree.map(np.testing.assert_array_equal, got, expected)
        assert [e.primitive for e in replaced.report.replaced] == ["unreduced_psum"]


@needs_unreduced
def test_an_unreduced_value_jaxcoll_cannot_type_as_jax_falls_back_naming_it():
    # jax's own collectives refuse unreduced operands but for the forms above, so no lax program reaches this
    # check today: the replacement is asked directly, for a ppermute of a value unreduced over its axis.
    from jaxcoll.replace import collectives, options
    mesh = _explicit_mesh(4)
    rows = []

    def body(v):
        u = lax.pcast(v, "x", to="unreduced")
        ask = lambda strict: collectives.replacement(  # noqa: E731
            options.make(strict=strict), "ppermute", dict(axis_name=("x",), perm=((0, 1), (1, 0))),
            [jax.typeof(u)], "", rows.append)
        with pytest.warns(ReplacementWarning, match="x='unreduced over x'"):
            assert ask(False) is None
        with pytest.raises(ReplacementError, match="x='unreduced over x'"):
            ask(True)
        return lax.psum(u, "x")
    jax.make_jaxpr(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P()))(
        jax.device_put(np.zeros(8, np.float32), NamedSharding(mesh, P("x"))))
    assert [(r.collective, r.replaced) for r in rows] == [("ppermute", False)]
