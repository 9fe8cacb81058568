"""compression= on jaxcoll.all_reduce, reduce_scatter and all_gather: results against numpy (the error bound of
docs/compression.md around the exact float64 sum), bitwise equal on every rank, derivatives equal to lax's,
vmap and scan, and the trace-time errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import compress_reference as ref
import jaxcoll
from jaxcoll.compress import Bf16, Fp8, Int8
from sharded import mesh, per_rank, put, sharded

B = 64
FORMATS = [("int8", Int8(B)), ("fp8", Fp8(B)), ("bf16", Bf16())]
IDS = [f[0] for f in FORMATS]


def inputs(n, shape, seed=0, outliers=True):
    x = np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)
    if outliers:
        x[1].flat[3] = 300.0  # an outlier in one rank's block
        x[n - 1].flat[-1] = -1e4
    return x


def all_reduce_bound(x, name):
    """sum_r e(x_r) + e(sum_r x'_r), per element of the flat per-rank vector (chunks are whole blocks)."""
    n = x.shape[0]
    flat = x.reshape(n, -1)
    if name == "bf16":  # the runtime sums the bf16 values in float32 and rounds once
        rounded = np.stack([ref.roundtrip(v, "bf16") for v in flat])
        return sum(ref.bound(v, "bf16") for v in flat) + ref.bound(rounded.sum(0), "bf16")
    first = sum(ref.bound(v, name, B) for v in flat)
    decoded = np.stack([ref.roundtrip(v, name, B) for v in flat]).sum(0)
    return first + ref.bound(decoded, name, B) + 8 * 2.0 ** -23 * np.abs(flat).sum(0)  # + float32 summation


@pytest.mark.parametrize("name,fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("mesh_name,axis", [("1d8", "i"), ("1d4", "i"), ("2x4", ("x", "y"))])
def test_all_reduce_is_within_the_bound_of_the_sum_and_identical_on_every_rank(name, fmt, mesh_name, axis):
    n = int(np.prod(mesh(mesh_name).devices.shape))
    x = inputs(n, (4, 2 * B))
    f = sharded(per_rank(lambda v: jaxcoll.all_reduce(v, axis, compression=fmt)), mesh_name)
    y = np.asarray(f(put(x, mesh_name)))
    assert np.all(y == y[0]), "every rank decodes the same bytes"
    err = np.abs(y[0].astype(np.float64) - x.astype(np.float64).sum(0)).reshape(-1)
    assert np.all(err <= all_reduce_bound(x, name)), np.max(err - all_reduce_bound(x, name))


@pytest.mark.parametrize("name,fmt", FORMATS[:2], ids=IDS[:2])
def test_all_reduce_over_2_ranks_encodes_once(name, fmt):
    # Over 2 ranks the call gathers both encodings and sums them (one hop): the bound is the first term alone,
    # which a second encoding of the sum (the two qgZ hops) would exceed on these inputs.
    x = inputs(2, (8, 2 * B))
    y = np.asarray(sharded(per_rank(lambda v: jaxcoll.all_reduce(v, "i", compression=fmt)), "1d2")(put(x, "1d2")))
    assert np.all(y == y[0]), "both ranks sum the same bytes in the same order"
    flat = x.reshape(2, -1)
    bound = sum(ref.bound(v, name, B) for v in flat) + 2 * 2.0 ** -23 * np.abs(flat).sum(0)
    err = np.abs(y[0].astype(np.float64) - x.astype(np.float64).sum(0)).reshape(-1)
    assert np.all(err <= bound), np.max(err - bound)


def test_all_reduce_result_is_invariant_like_psum():
    x = inputs(8, (256,))
    f = jax.jit(jax.shard_map(lambda v: (jaxcoll.all_reduce(v[0], "i", compression="int8"), lax.psum(v[0], "i")),
                              mesh=mesh("1d8"), in_specs=P("i"), out_specs=(P(), P())))
    y, exact = f(put(x, "1d8"))  # out_specs=P() holds only for a value invariant over "i"
    assert y.shape == exact.shape


@pytest.mark.parametrize("name,fmt", FORMATS, ids=IDS)
def test_all_reduce_of_a_size_no_chunk_divides_pads_whole_blocks(name, fmt):
    x = inputs(8, (3 * B,))  # 192 elements: not a multiple of 8 blocks
    y = np.asarray(sharded(per_rank(lambda v: jaxcoll.all_reduce(v, "i", compression=fmt)), "1d8")(
        put(x, "1d8")))
    err = np.abs(y[0].astype(np.float64) - x.astype(np.float64).sum(0))
    assert np.all(err <= all_reduce_bound(x, name))


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_all_reduce_propagates_non_finite_values(bad):
    x = inputs(8, (4 * B,), outliers=False)
    x[2, B + 5] = bad
    y = np.asarray(sharded(per_rank(lambda v: jaxcoll.all_reduce(v, "i", compression=Int8(B))), "1d8")(
        put(x, "1d8")))[0]
    assert not np.all(np.isfinite(y[B:2 * B])) and np.isnan(y[B + 5])
    others = np.r_[0:B, 2 * B:4 * B]
    assert np.all(np.isfinite(y[others]))


@pytest.mark.parametrize("name,fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("dim,tiled", [(0, True), (1, True), (1, False)])
def test_reduce_scatter_is_within_the_bound_of_psum_scatter(name, fmt, dim, tiled):
    shape = [8 * B, 8] if dim == 0 else [B, 8 if not tiled else 16]
    x = inputs(8, shape)
    f = sharded(per_rank(lambda v: jaxcoll.reduce_scatter(v, "i", scatter_dimension=dim, tiled=tiled,
                                                          compression=fmt)), "1d8")
    y = np.asarray(f(put(x, "1d8")))
    exact = np.asarray(sharded(per_rank(lambda v: lax.psum_scatter(v, "i", scatter_dimension=dim, tiled=tiled)),
                               "1d8")(put(x.astype(np.float64).astype(np.float32), "1d8")))
    assert y.shape == exact.shape
    # Rank r's piece is row-block r of the input moved to the front: its bound is the first hop's.
    moved = np.moveaxis(x, dim + 1, 1).reshape(8, 8, -1)  # (rank, piece, elements)
    for r in range(8):
        pieces = moved[:, r]
        if name == "bf16":
            bound = sum(ref.bound(p, "bf16") for p in pieces) + ref.bound(
                np.stack([ref.roundtrip(p, "bf16") for p in pieces]).sum(0), "bf16")
        else:
            bound = sum(ref.bound(p, name, B) for p in pieces) + 8 * 2.0 ** -23 * np.abs(pieces).sum(0)
        got = np.moveaxis(y[r], dim, 0).reshape(-1) if tiled else y[r].reshape(-1)
        truth = pieces.astype(np.float64).sum(0)
        assert np.all(np.abs(got - truth) <= bound)


@pytest.mark.parametrize("name,fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("axis,tiled", [(0, False), (1, False), (0, True), (1, True)])
def test_all_gather_gives_every_rank_the_decoded_slices(name, fmt, axis, tiled):
    x = inputs(8, (2, B))
    f = sharded(per_rank(lambda v: jaxcoll.all_gather(v, "i", axis=axis, tiled=tiled, compression=fmt)), "1d8")
    y = np.asarray(f(put(x, "1d8")))
    exact = np.asarray(sharded(per_rank(lambda v: lax.all_gather(v, "i", axis=axis, tiled=tiled)), "1d8")(
        put(x, "1d8")))
    assert y.shape == exact.shape and np.all(y == y[0])
    decoded = np.stack([ref.roundtrip(v.reshape(-1), name, B).reshape(v.shape) for v in x])
    want = np.asarray(sharded(per_rank(lambda v: lax.all_gather(v, "i", axis=axis, tiled=tiled)), "1d8")(
        put(decoded, "1d8")))
    np.testing.assert_allclose(y, want, rtol=2.0 ** -20, atol=0)


def test_derivatives_are_the_exact_collectives():
    x = put(inputs(8, (2 * B,)), "1d8")
    w = jnp.arange(2 * B, dtype=jnp.float32)

    def grads(reduce):
        return sharded(jax.grad(lambda v: jnp.sum(w * reduce(v)[..., :2 * B])), "1d8")(x)

    for c in (Int8(B), Fp8(B), "bf16"):
        np.testing.assert_array_equal(grads(lambda v: jaxcoll.all_reduce(v, "i", compression=c)),
                                      grads(lambda v: lax.psum(v, "i")))
        np.testing.assert_array_equal(
            grads(lambda v: jaxcoll.all_gather(v, "i", tiled=True, compression=c)),
            grads(lambda v: lax.all_gather(v, "i", tiled=True)))


def test_vmap_and_scan_run_the_compressed_all_reduce_per_slice():
    x = inputs(8, (3, 2 * B))
    fmt = Int8(B)

    def body(v):  # v: (1, 3, 2B) on each rank
        mapped = jax.vmap(lambda row: jaxcoll.all_reduce(row, "i", compression=fmt))(v[0])
        scanned = lax.scan(lambda c, row: (c, jaxcoll.all_reduce(row, "i", compression=fmt)), 0, v[0])[1]
        looped = jnp.stack([jaxcoll.all_reduce(v[0, j], "i", compression=fmt) for j in range(3)])
        return mapped[None], scanned[None], looped[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh("1d8"), in_specs=P("i"), out_specs=P("i")))
    mapped, scanned, looped = (np.asarray(a) for a in f(put(x, "1d8")))
    np.testing.assert_array_equal(mapped, looped)
    np.testing.assert_array_equal(scanned, looped)


def trace(fn, x, mesh_name="1d8"):
    return jax.jit(jax.shard_map(fn, mesh=mesh(mesh_name), in_specs=P("i"), out_specs=P("i"))).trace(
        put(x, mesh_name))


def test_integer_input_with_a_lossy_compression_is_refused_at_trace_time():
    with pytest.raises(TypeError, match="compression='int8' is lossy .* dtype=int32"):
        trace(lambda v: jaxcoll.all_reduce(v, "i", compression="int8"), np.ones((8, 256), np.int32))


def test_unknown_compression_name_is_refused():
    with pytest.raises(ValueError, match="compression='int4' is not a known compression"):
        trace(lambda v: jaxcoll.all_gather(v, "i", compression="int4"), np.ones((8, 256), np.float32))


def test_block_size_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match=r"block_size=256 of compression='fp8' does not divide the 96"):
        trace(lambda v: jaxcoll.all_reduce(v, "i", compression="fp8"), np.ones((8, 96), np.float32))
    with pytest.raises(ValueError, match=r"block_size=64 .* does not divide the 32"):
        trace(lambda v: jaxcoll.reduce_scatter(v[0], "i", tiled=True, compression=Int8(64))[None],
              np.ones((8, 256), np.float32))


def test_other_ops_and_plans_with_a_block_compression_are_refused():
    x = np.ones((8, 256), np.float32)
    with pytest.raises(ValueError, match="needs op='sum', got op='max'"):
        trace(lambda v: jaxcoll.all_reduce(v, "i", op="max", compression="int8"), x)
    with pytest.raises(ValueError, match="algorithm='ring' cannot be combined"):
        trace(lambda v: jaxcoll.all_reduce(v, "i", algorithm="ring", compression="int8"), x)


def test_pytrees_and_shard_map_without_check_vma():
    x = inputs(8, (2 * B,))
    tree = {"a": x, "b": x[:, :B] * 2}

    def body(t):
        return {"int8": jaxcoll.all_reduce(t, "i", compression=Int8(B)),
                "topk": jaxcoll.all_reduce(t, "i", compression=jaxcoll.compress.TopK(k=4))}

    for check_vma in (True, False):
        out = sharded(per_rank(body), "1d8", check_vma=check_vma)({k: put(v, "1d8") for k, v in tree.items()})
        for leaf in ("a", "b"):
            y = np.asarray(out["int8"][leaf])[0]
            assert np.all(np.abs(y - tree[leaf].astype(np.float64).sum(0)) <= all_reduce_bound(tree[leaf], "int8"))
            assert np.asarray(out["topk"][leaf]).shape == tree[leaf].shape
