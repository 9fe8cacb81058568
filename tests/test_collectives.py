"""Each jaxcoll collective gives what its jax.lax counterpart gives, on 1D meshes of 2, 4 and 8 devices and over
either axis or both axes of a 2x4 mesh. Inputs are small integers in every dtype, so results (sums included)
compare bitwise."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxcoll
from sharded import MESH_AXES, group_size, mesh, per_rank, put, sharded, small_ints

DTYPES = [np.float16, jnp.bfloat16, np.float32, np.int8, np.int32, np.uint8, np.uint32]
ids = [f"{m}-{a if isinstance(a, str) else '+'.join(a)}" for m, a in MESH_AXES]


def ranks(mesh_name):
    return mesh(mesh_name).devices.size


def inputs(mesh_name, shape, dtypes, seed=0):
    rng = np.random.default_rng(seed)
    return {np.dtype(d).name: put(small_ints(rng, (ranks(mesh_name), *shape), d), mesh_name) for d in dtypes}


def compare(mesh_name, ours, theirs, x):
    got = sharded(per_rank(ours), mesh_name)(x)
    want = sharded(per_rank(theirs), mesh_name)(x)
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(np.asarray(g), np.asarray(w)), got, want)
    return got


@pytest.mark.parametrize("mesh_name,axis_name", MESH_AXES, ids=ids)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_all_reduce_equals_psum_pmax_pmin(mesh_name, axis_name, op):
    dtypes = DTYPES + ([np.bool_] if op != "sum" else [])
    x = inputs(mesh_name, (3, 5), dtypes)
    ref = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[op]
    compare(mesh_name, lambda v: jaxcoll.all_reduce(v, axis_name, op=op), lambda v: ref(v, axis_name), x)


@pytest.mark.parametrize("mesh_name,axis_name", MESH_AXES, ids=ids)
def test_all_gather_equals_lax_all_gather(mesh_name, axis_name):
    x = inputs(mesh_name, (2, 3), DTYPES + [np.bool_])
    cases = [(0, False), (1, False), (2, False), (-1, True), (0, True), (1, True)]

    def run(gather):
        return lambda v: {f"{k}-{axis}-{tiled}": gather(leaf, axis, tiled)
                          for (axis, tiled), (k, leaf) in zip(cases * 2, list(v.items()))}
    compare(mesh_name, run(lambda v, a, t: jaxcoll.all_gather(v, axis_name, axis=a, tiled=t)),
            run(lambda v, a, t: lax.all_gather(v, axis_name, axis=a, tiled=t)), x)


@pytest.mark.parametrize("mesh_name,axis_name", MESH_AXES, ids=ids)
def test_reduce_scatter_equals_psum_scatter(mesh_name, axis_name):
    n = group_size(mesh_name, axis_name)
    x = inputs(mesh_name, (n, 2 * n), DTYPES)
    cases = [(0, False), (1, True), (0, True), (-1, True)]

    def run(scatter):
        return lambda v: {f"{k}-{d}-{t}": scatter(leaf, d, t)
                          for (d, t), (k, leaf) in zip(cases * 2, list(v.items()))}
    compare(mesh_name, run(lambda v, d, t: jaxcoll.reduce_scatter(v, axis_name, scatter_dimension=d, tiled=t)),
            run(lambda v, d, t: lax.psum_scatter(v, axis_name, scatter_dimension=d % v.ndim, tiled=t)), x)


@pytest.mark.parametrize("mesh_name,axis_name", MESH_AXES[:1] + MESH_AXES[4:5], ids=["1d2-i", "2x4-y"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_reduce_scatter_max_min_equal_the_scattered_pmax_pmin(mesh_name, axis_name, op):
    n = group_size(mesh_name, axis_name)
    x = inputs(mesh_name, (2 * n, 3), DTYPES + [np.bool_])
    ref = {"max": lax.pmax, "min": lax.pmin}[op]

    def theirs(v):
        full = ref(v, axis_name)
        i = lax.axis_index(axis_name)
        return jax.tree.map(lambda y: lax.dynamic_slice_in_dim(y, i * 2, 2, 0), full)
    compare(mesh_name, lambda v: jaxcoll.reduce_scatter(v, axis_name, tiled=True, op=op), theirs, x)


@pytest.mark.parametrize("mesh_name,axis_name", MESH_AXES, ids=ids)
def test_all_to_all_equals_lax_all_to_all(mesh_name, axis_name):
    n = group_size(mesh_name, axis_name)
    x = inputs(mesh_name, (n, 2 * n, 3), DTYPES + [np.bool_])
    cases = [(0, 0, False), (0, 2, False), (1, 0, True), (1, 2, True), (0, 1, False), (1, 1, True)]

    def run(a2a):
        return lambda v: {f"{k}-{s}-{c}-{t}": a2a(leaf, s, c, t)
                          for (s, c, t), (k, leaf) in zip(cases * 2, list(v.items()))}
    compare(mesh_name, run(lambda v, s, c, t: jaxcoll.all_to_all(v, axis_name, s, c, tiled=t)),
            run(lambda v, s, c, t: lax.all_to_all(v, axis_name, s, c, tiled=t)), x)


@contextlib.contextmanager
def ppermute_order_check(on: bool):
    """jax >= 0.11 refuses by default a ppermute over axes out of the mesh's order
    (`jax_raise_on_ppermute_sort_diff`); jax 0.10 has no such check and always numbers in mesh order."""
    if not hasattr(jax.config, "jax_raise_on_ppermute_sort_diff"):
        yield
        return
    before = jax.config.jax_raise_on_ppermute_sort_diff
    jax.config.update("jax_raise_on_ppermute_sort_diff", on)
    try:
        yield
    finally:
        jax.config.update("jax_raise_on_ppermute_sort_diff", before)


@pytest.mark.parametrize("mesh_name,axis_name", MESH_AXES, ids=ids)
def test_ppermute_equals_lax_ppermute(mesh_name, axis_name):
    """Ranks of a tuple of axes are numbered as the running jax's lax.ppermute numbers them (mesh order up to
    0.10, the tuple's order from 0.11, where the order check is turned off here to compare values)."""
    n = group_size(mesh_name, axis_name)
    perms = [[(i, (i + 1) % n) for i in range(n)],  # a cycle
             [(0, n - 1)],  # one pair: every other rank gets zeros
             [(i, i) for i in range(n)],  # the identity
             [(i, n - 1 - i) for i in range(n)]]  # a reversal
    x = inputs(mesh_name, (4,), DTYPES + [np.bool_])

    def run(pp):
        return lambda v: {f"{k}-{j}": pp(leaf, p) for j, p in enumerate(perms) for k, leaf in v.items()}
    with ppermute_order_check(False):
        compare(mesh_name, run(lambda v, p: jaxcoll.ppermute(v, axis_name, p)),
                run(lambda v, p: lax.ppermute(v, axis_name, p)), x)


@pytest.mark.parametrize("axis_name", [("x", "y"), ("y", "x")], ids=["x+y", "y+x"])
def test_ppermute_over_axes_out_of_mesh_order_fails_exactly_when_lax_ppermute_does(axis_name):
    """Under the default config jaxcoll.ppermute raises the RuntimeError lax.ppermute raises (jax >= 0.11, axes
    out of the mesh's order) and runs where lax.ppermute runs; the cycle's values then agree with lax's."""
    x = put(np.arange(8, dtype=np.int32).reshape(8, 1), "2x4")
    cycle = [(i, (i + 1) % 8) for i in range(8)]
    outcomes = []
    for pp in (jaxcoll.ppermute, lax.ppermute):
        with ppermute_order_check(True):
            try:
                outcomes.append(np.asarray(sharded(per_rank(lambda v: pp(v, axis_name, cycle)), "2x4")(x)))
            except RuntimeError as e:
                outcomes.append(e)
    ours, theirs = outcomes
    if isinstance(theirs, RuntimeError):
        assert isinstance(ours, RuntimeError), f"lax.ppermute raised {theirs!r}, jaxcoll.ppermute returned {ours}"
        assert "jax_raise_on_ppermute_sort_diff" in str(ours) and "('y', 'x')" in str(ours)
    else:
        assert not isinstance(ours, RuntimeError), f"lax.ppermute ran, jaxcoll.ppermute raised {ours!r}"
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("mesh_name,axis_name", MESH_AXES, ids=ids)
def test_broadcast_gives_every_rank_the_roots_value(mesh_name, axis_name):
    n = group_size(mesh_name, axis_name)
    x = inputs(mesh_name, (2, 3), DTYPES + [np.bool_])
    roots = sorted({0, n - 1, n // 2})

    def run(bc):
        return lambda v: {f"{k}-{r}": bc(leaf, r) for r in roots for k, leaf in v.items()}
    compare(mesh_name, run(lambda v, r: jaxcoll.broadcast(v, axis_name, root=r)),
            run(lambda v, r: lax.all_gather(v, axis_name)[r]), x)


@pytest.mark.parametrize("mesh_name,axis_name", MESH_AXES, ids=ids)
def test_float_sums_match_lax_and_are_bitwise_identical_on_every_rank(mesh_name, axis_name):
    """Real-valued floats: sums agree with lax to rounding, and every rank of a group holds the same bits."""
    rng = np.random.default_rng(1)
    n = group_size(mesh_name, axis_name)
    r = ranks(mesh_name)
    x = {np.dtype(d).name: put(rng.standard_normal((r, 2 * n, 33)).astype(d), mesh_name)
         for d in (np.float32, jnp.bfloat16, np.float16)}
    got = sharded(per_rank(lambda v: jaxcoll.all_reduce(v, axis_name)), mesh_name)(x)
    want = sharded(per_rank(lambda v: lax.psum(v, axis_name)), mesh_name)(x)
    m = mesh(mesh_name)
    axes = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    for k in x:
        g, w = np.asarray(got[k], np.float32), np.asarray(want[k], np.float32)
        tol = 1e-5 if k == "float32" else 3e-2
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * n)
        # rows of the mesh that differ only along the reduced axes belong to one group
        g = np.asarray(got[k]).reshape(*m.devices.shape, -1)
        g = np.moveaxis(g, [m.axis_names.index(a) for a in axes], range(len(axes)))
        g = g.reshape(n, -1, g.shape[-1])
        for i in range(1, n):
            assert g[i].tobytes() == g[0].tobytes(), f"rank {i} of a group differs from rank 0 ({k})"


def test_x64_dtypes_equal_lax():
    with jax.enable_x64(True):
        x = inputs("2x4", (4, 8), [np.float64, np.int64])
        for ours, theirs in [
                (lambda v: jaxcoll.all_reduce(v, "y"), lambda v: lax.psum(v, "y")),
                (lambda v: jaxcoll.all_gather(v, "x", axis=1), lambda v: lax.all_gather(v, "x", axis=1)),
                (lambda v: jaxcoll.reduce_scatter(v, ("x", "y"), scatter_dimension=1, tiled=True),
                 lambda v: lax.psum_scatter(v, ("x", "y"), scatter_dimension=1, tiled=True)),
                (lambda v: jaxcoll.all_to_all(v, "y", 0, 1, tiled=True),
                 lambda v: lax.all_to_all(v, "y", 0, 1, tiled=True))]:
            compare("2x4", ours, theirs, x)


def test_all_reduce_maps_over_pytrees_like_psum():
    x = inputs("1d4", (3,), [np.float32, np.int32])
    tree = lambda v: {"a": (v["float32"], [v["int32"]]), "b": v["float32"] * 2}
    compare("1d4", lambda v: jaxcoll.all_reduce(tree(v), "i"), lambda v: lax.psum(tree(v), "i"), x)


def test_invariant_values_are_reduced_over_their_equal_copies_like_psum():
    x = inputs("2x4", (3,), [np.float32])

    def run(reduce):
        def f(v):
            inv = reduce(v["float32"], "y")  # invariant over y
            return {"twice": reduce(inv, "y"), "const": reduce(jnp.ones(3), ("x", "y")) + 0 * inv}
        return f
    compare("2x4", run(jaxcoll.all_reduce), run(lax.psum), x)


def test_group_of_one_rank_is_the_identity():
    m = jax.make_mesh((8, 1), ("a", "b"))
    x = jax.device_put(small_ints(np.random.default_rng(2), (8, 4), np.int32),
                       jax.NamedSharding(m, jax.P(("a", "b"))))

    def f(v):
        return (jaxcoll.all_reduce(v, "b"), jaxcoll.all_gather(v, "b", axis=1, tiled=True),
                jaxcoll.reduce_scatter(v, "b", tiled=True), jaxcoll.all_to_all(v, "b", 1, 0, tiled=True),
                jaxcoll.ppermute(v, "b", [(0, 0)]), jaxcoll.ppermute(v, "b", []), jaxcoll.broadcast(v, "b"))
    spec = jax.P(("a", "b"))
    outs = jax.jit(jax.shard_map(f, mesh=m, in_specs=spec, out_specs=spec))(x)
    for y in outs[:5] + outs[6:]:
        np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(outs[5], np.zeros_like(x))


@pytest.mark.parametrize("algorithm", ["direct", "ring", "two_shot"])
def test_every_all_reduce_algorithm_equals_psum(algorithm):
    x = inputs("2x4", (5, 7), [np.float32, np.int32, jnp.bfloat16])
    compare("2x4", lambda v: jaxcoll.all_reduce(v, ("x", "y"), algorithm=algorithm),
            lambda v: lax.psum(v, ("x", "y")), x)


def test_a_plan_given_as_algorithm_runs():
    from jaxcoll.algorithms import builtin
    from jaxcoll.plan import Collective
    x = inputs("1d4", (8,), [np.float32])
    ring = builtin(Collective.ALL_GATHER, "ring", 4)
    compare("1d4", lambda v: jaxcoll.all_gather(v, "i", algorithm=ring), lambda v: lax.all_gather(v, "i"), x)


@pytest.mark.parametrize("mesh_name,axis_name", [("2x4", "y"), ("2x4", ("x", "y"))])
def test_results_are_typed_varying_or_invariant_exactly_as_lax_types_them(mesh_name, axis_name):
    n = group_size(mesh_name, axis_name)
    pairs = {
        "all_reduce": (lambda v: jaxcoll.all_reduce(v, axis_name), lambda v: lax.psum(v, axis_name)),
        "all_reduce_max": (lambda v: jaxcoll.all_reduce(v, axis_name, op="max"), lambda v: lax.pmax(v, axis_name)),
        "all_gather": (lambda v: jaxcoll.all_gather(v, axis_name), lambda v: lax.all_gather(v, axis_name)),
        "reduce_scatter": (lambda v: jaxcoll.reduce_scatter(v, axis_name, tiled=True),
                           lambda v: lax.psum_scatter(v, axis_name, tiled=True)),
        "all_to_all": (lambda v: jaxcoll.all_to_all(v, axis_name, 0, 0, tiled=True),
                       lambda v: lax.all_to_all(v, axis_name, 0, 0, tiled=True)),
        "ppermute": (lambda v: jaxcoll.ppermute(v, axis_name, [(0, 1)]),
                     lambda v: lax.ppermute(v, axis_name, [(0, 1)])),
    }
    m = mesh(mesh_name)
    for name, (ours, theirs) in pairs.items():
        for invariant in (False, True):
            def types(fn):
                def body(v):
                    v = lax.psum(v, m.axis_names) if invariant else v
                    t = jax.typeof(fn(v))
                    types.out = (t.shape, t.dtype, t.mat.varying)
                    return v
                jax.eval_shape(jax.shard_map(body, mesh=m, in_specs=jax.P(m.axis_names),
                                             out_specs=jax.P(m.axis_names)), put(np.zeros((8 * n, 3)), mesh_name))
                return types.out
            assert types(ours) == types(theirs), (name, invariant)


# axis_index_groups, as lax takes it: each group of positions along the axes runs as a group of its own. Groups
# that are not contiguous, listed out of order, and over a tuple of axes (positions of the linearized pair).
INDEX_GROUPS = [("1d8", "i", [[0, 2, 4, 6], [1, 3, 5, 7]]), ("1d8", "i", [[5, 1], [0, 7], [6, 2], [3, 4]]),
                ("2x4", "y", [[3, 0], [2, 1]]), ("2x4", ("x", "y"), [[0, 5, 2, 7], [4, 1, 6, 3]])]


@pytest.mark.parametrize("mesh_name,axis_name,groups", INDEX_GROUPS,
                         ids=["strided", "pairs_out_of_order", "one_axis_of_two", "a_tuple"])
def test_the_collectives_over_axis_index_groups_equal_lax_and_numpy(mesh_name, axis_name, groups):
    k = len(groups[0])
    x = inputs(mesh_name, (2 * k, 3), [np.float32, np.int32])
    pairs = {
        "all_reduce": (lambda v: jaxcoll.all_reduce(v, axis_name, axis_index_groups=groups),
                       lambda v: lax.psum(v, axis_name, axis_index_groups=groups)),
        "all_reduce_min": (lambda v: jaxcoll.all_reduce(v, axis_name, op="min", axis_index_groups=groups),
                           lambda v: lax.pmin(v, axis_name, axis_index_groups=groups)),
        "all_gather": (lambda v: jaxcoll.all_gather(v, axis_name, axis=1, tiled=True, axis_index_groups=groups),
                       lambda v: lax.all_gather(v, axis_name, axis=1, tiled=True, axis_index_groups=groups)),
        "reduce_scatter": (lambda v: jaxcoll.reduce_scatter(v, axis_name, tiled=True, axis_index_groups=groups),
                           lambda v: lax.psum_scatter(v, axis_name, tiled=True, axis_index_groups=groups)),
        "all_to_all": (lambda v: jaxcoll.all_to_all(v, axis_name, 0, 1, tiled=True, axis_index_groups=groups),
                       lambda v: lax.all_to_all(v, axis_name, 0, 1, tiled=True, axis_index_groups=groups)),
    }
    for name, (ours, theirs) in pairs.items():
        got = sharded(per_rank(ours), mesh_name, check_vma=False)(x)
        want = sharded(per_rank(theirs), mesh_name, check_vma=False)(x)
        jax.tree.map(lambda g, w: np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=name),
                     got, want)
    # The sum, against numpy: each rank holds its group's sum.
    m = mesh(mesh_name)
    axes = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    summed = sharded(per_rank(pairs["all_reduce"][0]), mesh_name, check_vma=False)(x)["float32"]
    values = np.asarray(x["float32"])
    for d in range(m.devices.size):  # device d: its coordinates in row-major order over the mesh axes
        coords = dict(zip(m.axis_names, np.unravel_index(d, m.devices.shape)))
        index = int(np.ravel_multi_index([coords[a] for a in axes], [m.shape[a] for a in axes]))
        members = next(g for g in groups if index in g)
        peers = []
        for position in members:
            peer = dict(coords, **dict(zip(axes, np.unravel_index(position, [m.shape[a] for a in axes]))))
            peers.append(int(np.ravel_multi_index([peer[a] for a in m.axis_names], m.devices.shape)))
        np.testing.assert_array_equal(np.asarray(summed)[d], values[peers].sum(0))


@pytest.mark.parametrize("call", [
    lambda v: jaxcoll.all_reduce(v, "i", compression="int8", axis_index_groups=[[0, 1], [2, 3]]),
    lambda v: jaxcoll.all_reduce(v, "i", op="adasum", axis_index_groups=[[0, 1], [2, 3]]),
    lambda v: jaxcoll.all_gather(v, "i", compression="bf16", axis_index_groups=[[0, 1], [2, 3]]),
    lambda v: jaxcoll.reduce_scatter(v, "i", compression="fp8", axis_index_groups=[[0, 1], [2, 3]]),
], ids=["all_reduce_int8", "adasum", "all_gather_bf16", "reduce_scatter_fp8"])
def test_axis_index_groups_with_compression_is_refused_naming_both(call):
    x = put(np.zeros((4, 256), np.float32), "1d4")
    with pytest.raises(ValueError, match=r"axis_index_groups=\[\[0, 1\], \[2, 3\]\].*(compression=|op='adasum')"):
        sharded(per_rank(call), "1d4")(x)


@pytest.mark.parametrize("groups", [[[0, 1, 2], [3]], [[0, 1], [1, 2]], [[0, 1], [2, 5]]],
                         ids=["unequal_sizes", "overlapping", "not_covering"])
def test_bad_axis_index_groups_fail_while_tracing_naming_the_argument(groups):
    x = put(np.zeros((4, 8), np.float32), "1d4")
    with pytest.raises(ValueError, match=r"axis_index_groups"):
        sharded(per_rank(lambda v: jaxcoll.all_gather(v, "i", axis_index_groups=groups)), "1d4")(x)
