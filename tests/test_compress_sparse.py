"""The sparse all-reduce (Ok-Topk design) and Adasum against numpy references written from their definitions."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jaxcoll
from compress_reference import numpy_adasum, numpy_threshold, numpy_topk
from jaxcoll.compress import TopK, topk_all_reduce
from jaxcoll.compress import sparse
from jaxcoll.compress.sparse import Layout
from jaxcoll.plan import abi
from sharded import mesh, per_rank, put, sharded


def run_topk(x, mesh_name, axis, kernels=None, **kw):
    """(result, residuals) of the sparse all-reduce of x's rows (one a rank), by the kernels on XLA:CPU
    (kernels=None), or by the jax.numpy stages other platforms run (kernels=False)."""
    topk = TopK(**kw)
    axes = axis if isinstance(axis, tuple) else (axis,)
    m = mesh(mesh_name)
    f = jax.jit(jax.shard_map(
        lambda v: jax.tree.map(lambda a: a[None], sparse.topk_leaf(v[0], axes, topk, "test", kernels)),
        mesh=m, in_specs=P(tuple(m.axis_names)), out_specs=P(tuple(m.axis_names))))
    return tuple(np.asarray(a) for a in f(put(x, mesh_name)))


@pytest.mark.parametrize("kernels", [None, False])
@pytest.mark.parametrize("mesh_name,axis,length,k", [("1d8", "i", 1000, 10), ("1d8", "i", 4096, 41),
                                                     ("1d4", "i", 777, 50), ("2x4", ("x", "y"), 512, 512),
                                                     ("1d8", "i", 13, 1), ("1d8", "i", 150_001, 1500)])
def test_topk_all_reduce_equals_the_numpy_reference(mesh_name, axis, length, k, kernels):
    # 150_001 elements: the threshold comes from a sample of 65536; 13: regions of 2, the last ones empty.
    n = int(np.prod(mesh(mesh_name).devices.shape))
    x = np.random.default_rng(k).standard_normal((n, length)).astype(np.float32)
    result, residual = run_topk(x, mesh_name, axis, kernels, k=k)
    want, want_residual = numpy_topk(x, k)
    assert np.all(result == result[0])
    np.testing.assert_array_equal(result[0], want)
    np.testing.assert_array_equal(residual, want_residual)


def test_topk_over_one_axis_of_a_2d_mesh_sums_each_group():
    # On the 2x4 mesh, reducing over "y" sums the 4 ranks of each x row: two independent groups.
    x = np.random.default_rng(9).standard_normal((8, 500)).astype(np.float32)
    f = jax.jit(jax.shard_map(lambda v: jax.tree.map(lambda a: a[None], topk_all_reduce(v[0], "y", k=20)),
                              mesh=mesh("2x4"), in_specs=P(("x", "y")), out_specs=P(("x", "y"))))
    result, residual = (np.asarray(a) for a in f(put(x, "2x4")))
    for row in range(2):
        ranks = slice(4 * row, 4 * row + 4)
        want, want_residual = numpy_topk(x[ranks], 20)
        np.testing.assert_array_equal(result[ranks], np.broadcast_to(want, (4, 500)))
        np.testing.assert_array_equal(residual[ranks], want_residual)


def test_topk_public_function_is_the_reference_on_a_pytree():
    x = np.random.default_rng(3).standard_normal((8, 2, 300)).astype(np.float32)
    f = jax.jit(jax.shard_map(lambda v: topk_all_reduce({"a": v[0, 0], "b": v[0, 1]}, "i", k=12),
                              mesh=mesh("1d8"), in_specs=P("i"), out_specs=(P(), P("i"))))
    result, residual = f(put(x, "1d8"))
    for j, leaf in enumerate("ab"):
        want, want_residual = numpy_topk(x[:, j], 12)
        np.testing.assert_array_equal(np.asarray(result[leaf]), want)
        np.testing.assert_array_equal(np.asarray(residual[leaf]).reshape(8, 300), want_residual)


def test_result_is_the_dense_all_reduce_of_the_entries_sent_and_kept():
    x = np.random.default_rng(0).standard_normal((8, 2000)).astype(np.float32)
    result, residual = run_topk(x, "1d8", "i", fraction=0.01)
    sent = x - residual  # what each rank's residual gave up
    assert np.all((residual == x) | (residual == 0))
    np.testing.assert_allclose(result[0], sent.sum(0), rtol=1e-6, atol=1e-6)
    assert 0 < np.count_nonzero(result[0]) <= 8 * Layout.of(2000, 20, 8).kept  # about k entries in all


def test_about_k_entries_are_selected_from_a_large_vector():
    # A sampled threshold (L > 65536): the count is near k, not exact; a smooth distribution and one with
    # heavy tails and many zeros.
    rng = np.random.default_rng(4)
    for x in (rng.standard_normal((8, 1_000_000)), rng.standard_cauchy((8, 1_000_000)) * (rng.random((8, 1)) > 0)):
        x = x.astype(np.float32)
        for r in range(8):
            t = numpy_threshold(x[r], 10_000)
            count = np.count_nonzero(np.abs(x[r]) >= t) if t > 0 else 0
            assert count == 0 if not x[r].any() else 0.9 * 10_000 <= count <= 1.1 * 10_000
    x = rng.standard_normal((8, 1_000_000)).astype(np.float32)
    result, residual = run_topk(x, "1d8", "i", k=10_000)
    want, want_residual, masks = numpy_topk(x, 10_000, details=True)
    np.testing.assert_array_equal(result[0], want)
    np.testing.assert_array_equal(residual, want_residual)
    assert 0.9 * 10_000 <= np.count_nonzero(result[0]) <= 8 * -(-10_000 // 8)
    assert np.all(0.9 * 10_000 <= masks["selected"].sum(1)) and np.all(masks["selected"].sum(1) <= 1.1 * 10_000)


def test_a_full_bucket_leaves_the_rest_in_the_residual():
    # k=16 on 8 ranks: buckets of 2 * ceil(16/8) = 4 slots. Rank 0's 10 largest entries all lie in region 0
    # (stripes 0, 8, ...: elements 0..15, 128..143, ...): the first 4 in index order go, the other 6 stay home.
    x = np.random.default_rng(6).standard_normal((8, 800)).astype(np.float32) * 0.01
    big = np.array([0, 3, 6, 9, 12, 15, 130, 133, 136, 139])
    x[0, big] = np.arange(10, 20, dtype=np.float32)
    result, residual = run_topk(x, "1d8", "i", k=16)
    want, want_residual, masks = numpy_topk(x, 16, details=True)
    np.testing.assert_array_equal(result[0], want)
    np.testing.assert_array_equal(residual, want_residual)
    assert masks["selected"][0, big].all() and masks["sent"][0, big].sum() == 4
    np.testing.assert_array_equal(residual[0, big[4:]], x[0, big[4:]])  # not sent: still in the residual
    assert np.all(result[0, big[4:]] == 0)


def test_entries_the_owner_drops_return_to_the_residual():
    # Every rank selects its own 8 largest (L <= 65536: an exact threshold), in different places; each owner
    # keeps ceil(8/8) = 1 sum of its region, so most sent entries come back.
    x = np.random.default_rng(8).standard_normal((8, 64)).astype(np.float32)
    result, residual, = run_topk(x, "1d8", "i", k=8)
    want, want_residual, masks = numpy_topk(x, 8, details=True)
    np.testing.assert_array_equal(result[0], want)
    np.testing.assert_array_equal(residual, want_residual)
    dropped = masks["sent"] & ~masks["kept"]
    assert dropped.sum() > 8 and np.all(residual[dropped] == x[dropped])
    assert np.count_nonzero(result[0]) <= 8


def test_threshold_keeps_small_entries_home():
    x = np.random.default_rng(1).standard_normal((8, 800)).astype(np.float32) * 0.1
    x[3, 17] = 5.0
    result, residual = run_topk(x, "1d8", "i", k=8, threshold=1.0)
    np.testing.assert_array_equal(result[0], numpy_topk(x, 8, threshold=1.0)[0])
    assert np.count_nonzero(result[0]) == 1 and result[0, 17] == 5.0
    np.testing.assert_array_equal(np.delete(residual.reshape(-1), 3 * 800 + 17), np.delete(x.reshape(-1),
                                                                                            3 * 800 + 17))


@pytest.mark.parametrize("kernels", [None, False])
def test_non_finite_entries_are_always_sent_and_equal_magnitudes_go_to_the_lower_index(kernels):
    x = np.zeros((8, 64), np.float32)
    x[:, 5] = 3.0
    x[:, 6] = -3.0  # the same magnitude in the same region (0: stripe 0 is elements 0..15)
    x[4, 10] = -np.inf  # region 0 too
    x[2, 40] = np.nan  # region 2
    x[6, 50] = 1e-3  # region 3; tiny, but rank 6 sends it when nothing larger competes
    result, residual = run_topk(x, "1d8", "i", kernels, k=2, threshold=100.0)  # nothing finite reaches 100
    assert result[0, 10] == -np.inf and np.isnan(result[0, 40]) and np.count_nonzero(result[0]) == 2
    assert residual[4, 10] == 0 and np.isnan(x[2, 40]) and residual[2, 40] == 0
    np.testing.assert_array_equal(np.delete(residual.reshape(-1), [4 * 64 + 10, 2 * 64 + 40]),
                                  np.delete(x.reshape(-1), [4 * 64 + 10, 2 * 64 + 40]))
    clean = x.copy()
    clean[4, 10] = clean[2, 40] = 0
    result, residual = run_topk(clean, "1d8", "i", kernels, k=16)  # 2 kept per region
    want, want_residual = numpy_topk(clean, 16)
    np.testing.assert_array_equal(result[0], want)
    np.testing.assert_array_equal(residual, want_residual)
    assert result[0, 5] == 24.0 and result[0, 6] == -24.0 and result[0, 50] == np.float32(1e-3)
    result, residual = run_topk(clean, "1d8", "i", kernels, k=8)  # 1 kept per region: 24 and -24 tie
    assert result[0, 5] == 24.0 and result[0, 6] == 0 and np.all(residual[:, 6] == -3.0)


def test_zeros_are_never_selected():
    result, residual = run_topk(np.zeros((8, 100), np.float32), "1d8", "i", k=50)
    assert np.all(result == 0) and np.all(residual == 0)


def test_the_kernels_refuse_malformed_buckets_naming_them():
    # What the kernels read comes from other ranks: a bucket whose positions do not ascend, or name elements past
    # x, is an error rather than a write out of bounds.
    result = jax.jit(lambda g: sparse._kernel(abi.TOPK_RESULT_TARGET, g, 40, jnp.float32, g, nranks=2))
    ok = np.array([0, 3, 7, 1] + [-1, 0, 0, 0], np.int32)  # owner 0 holds positions 0 and 3; owner 1 none
    np.testing.assert_array_equal(np.nonzero(np.asarray(result(ok)))[0], [0, 3])
    with pytest.raises(Exception, match=r"owner 0 has position 3 in slot 1; positions must ascend"):
        result(np.array([3, 3, 7, 1] + [-1, 0, 0, 0], np.int32)).block_until_ready()
    with pytest.raises(Exception, match=r"owner 1 has position 16, past x's 40 elements"):
        result(np.array([0, 3, 7, 1] + [16, -1, 0, 0], np.int32)).block_until_ready()
    select = jax.jit(lambda v: sparse._kernel(abi.TOPK_SELECT_TARGET, v, 8, jnp.int32, v, k=5, nranks=2,
                                              threshold=np.float32(0)))
    with pytest.raises(Exception, match=r"k=5 is out of range for x of 4 elements"):
        select(np.ones(4, np.float32)).block_until_ready()


def test_other_platforms_lower_the_jnp_stages_not_the_cpu_kernels():
    # The kernels are registered for XLA:CPU only: a program lowered for CUDA must not name them.
    x = jax.ShapeDtypeStruct((8 * 4096,), jnp.float32, sharding=jax.sharding.NamedSharding(mesh("1d8"), P("i")))
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.all_reduce(v, "i", compression=TopK(fraction=0.01)),
                              mesh=mesh("1d8"), in_specs=P("i"), out_specs=P()))
    targets = {p: set(re.findall(r"custom_call @(\w+)", f.trace(x).lower(lowering_platforms=(p,)).as_text()))
               for p in ("cpu", "cuda")}
    assert targets["cpu"] == {"jaxcoll_all_to_all", "jaxcoll_all_gather", "jaxcoll_topk_select",
                              "jaxcoll_topk_reduce", "jaxcoll_topk_result"}  # the residual is unused: dropped
    assert targets["cuda"] == {"jaxcoll_all_to_all", "jaxcoll_all_gather"}


def test_traffic_is_order_k():
    lay = Layout.of(16 * 2 ** 20, 16 * 2 ** 20 // 100, 8)
    assert lay.wire_bytes() == 8 * 7 * (2 * -(-lay.k // 8) + -(-lay.k // 8))  # hop 1's buckets, hop 2's
    assert lay.wire_bytes() * 30 < 2 * 7 / 8 * 4 * 16 * 2 ** 20  # >= 30x less than the dense float32 sum
    assert Layout.of(512, 512, 8).capacity == Layout.of(512, 512, 8).kept == 64  # k = L: everything, exactly


def test_topk_through_all_reduce_and_its_derivative():
    x = np.random.default_rng(2).standard_normal((8, 640)).astype(np.float32)
    y = np.asarray(sharded(per_rank(lambda v: jaxcoll.all_reduce(v, "i", compression=TopK(k=64))), "1d8")(
        put(x, "1d8")))
    np.testing.assert_array_equal(y[0], numpy_topk(x, 64)[0])
    w = jnp.arange(640, dtype=jnp.float32)
    grad = lambda reduce: sharded(jax.grad(lambda v: jnp.sum(w * reduce(v))), "1d8")(put(x, "1d8"))  # noqa
    np.testing.assert_array_equal(grad(lambda v: jaxcoll.all_reduce(v, "i", compression=TopK(fraction=0.1))),
                                  grad(lambda v: lax.psum(v, "i")))


@pytest.mark.parametrize("kw,message", [(dict(k=0), "k=0 is out of range"), (dict(k=641), "k=641 is out of range"),
                                        (dict(fraction=1.5), "fraction=1.5 is out of range"),
                                        (dict(k=3, fraction=0.1), "exactly one of k and fraction"),
                                        (dict(k=3, threshold=-1.0), "threshold=-1.0 must be None or a number")])
def test_k_out_of_range_is_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        run_topk(np.ones((8, 640), np.float32), "1d8", "i", **kw)


def test_topk_refuses_integers_and_other_collectives():
    with pytest.raises(TypeError, match="dtype=int32"):
        run_topk(np.ones((8, 64), np.int32), "1d8", "i", k=4)
    with pytest.raises(ValueError, match="sparse.*all_reduce only"):
        sharded(per_rank(lambda v: jaxcoll.all_gather(v, "i", compression=TopK(k=2))), "1d8")(
            put(np.ones((8, 64), np.float32), "1d8"))


# -- Adasum ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mesh_name", ["1d2", "1d4", "1d8"])
def test_adasum_equals_the_recursive_formula(mesh_name):
    n = int(np.prod(mesh(mesh_name).devices.shape))
    x = np.random.default_rng(n).standard_normal((n, 3, 50)).astype(np.float32) + np.linspace(0, 1, 150).reshape(3, 50)
    y = np.asarray(sharded(per_rank(lambda v: jaxcoll.all_reduce(v, "i", op="adasum")), mesh_name)(
        put(x, mesh_name)))
    assert np.all(y == y[0])
    want = numpy_adasum([v.reshape(-1).astype(np.float64) for v in x]).reshape(3, 50)
    np.testing.assert_allclose(y[0], want, rtol=2e-5, atol=2e-5)


def test_adasum_adds_orthogonal_gradients_and_keeps_equal_ones():
    eye = np.eye(8, 16, dtype=np.float32) * np.arange(1, 9, dtype=np.float32)[:, None]
    y = np.asarray(sharded(per_rank(lambda v: jaxcoll.adasum(v, "i")), "1d8")(put(eye, "1d8")))
    np.testing.assert_allclose(y[0], eye.sum(0), rtol=1e-6)
    same = np.tile(np.arange(16, dtype=np.float32), (8, 1))
    y = np.asarray(sharded(per_rank(lambda v: jaxcoll.adasum(v, "i")), "1d8")(put(same, "1d8")))
    np.testing.assert_allclose(y[0], same[0], rtol=1e-6)


def test_adasum_result_is_invariant_and_handles_zero_gradients():
    x = np.zeros((8, 32), np.float32)
    x[5] = 1.0
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.adasum(v[0], "i"), mesh=mesh("1d8"), in_specs=P("i"),
                              out_specs=P()))
    np.testing.assert_allclose(np.asarray(f(put(x, "1d8"))), x[5])


def test_adasum_needs_a_power_of_two_group():
    m = jax.make_mesh((6,), ("i",), devices=jax.devices()[:6])
    with pytest.raises(ValueError, match="has 6 ranks; .* power of two"):
        jax.jit(jax.shard_map(lambda v: jaxcoll.adasum(v, "i"), mesh=m, in_specs=P("i"), out_specs=P("i"))).trace(
            jax.device_put(jnp.ones((6, 4)), jax.sharding.NamedSharding(m, P("i"))))


def test_topk_and_adasum_under_vmap_and_scan_match_a_loop():
    x = np.random.default_rng(5).standard_normal((8, 3, 200)).astype(np.float32)

    def body(v):
        rows = v[0]
        topk = lambda r: topk_all_reduce(r, "i", k=10)[0]  # noqa: E731
        ada = lambda r: jaxcoll.adasum(r, "i")  # noqa: E731
        out = []
        for fn in (topk, ada):
            looped = jnp.stack([fn(rows[j]) for j in range(3)])
            out += [jax.vmap(fn)(rows) - looped, lax.scan(lambda c, r: (c, fn(r)), 0, rows)[1] - looped]
        return jnp.stack(out)[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh("1d8"), in_specs=P("i"), out_specs=P("i")))
    assert np.all(np.asarray(f(put(x, "1d8"))) == 0)


def jnp_adasum(gs):
    """The recursive formula in jax.numpy on a stacked (N, L) array: a reference to differentiate."""
    if gs.shape[0] == 1:
        return gs[0]
    h = gs.shape[0] // 2
    a, b = jnp_adasum(gs[:h]), jnp_adasum(gs[h:])
    dot = a @ b
    return (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b


def test_adasum_gradient_is_the_formulas():
    x = np.random.default_rng(7).standard_normal((8, 24)).astype(np.float32) + 0.5
    w = jnp.linspace(-1.0, 1.0, 24)
    grad = sharded(jax.grad(lambda v: jnp.sum(w * jaxcoll.adasum(v[0], "i"))), "1d8")(put(x, "1d8"))
    want = jax.grad(lambda xs: jnp.sum(w * jnp_adasum(xs)))(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want), rtol=1e-4, atol=1e-5)
