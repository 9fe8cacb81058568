"""compress_axes= (hierarchical compression, jaxcoll/compress/two_level.py) on a 2x4 mesh: exact over the
other axes, compressed only across compress_axes. Results against numpy (the bound of the outer hop alone, on
the exact partial sums), pieces where lax.psum_scatter puts them, derivatives equal to lax's, vmap and scan,
and the trace-time errors."""

import re

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
SIZES = {"x": 2, "y": 4}  # the 2x4 mesh; device d = 4 * x + y


def coords(d):
    return {"x": d // 4, "y": d % 4}


def linear(d, axes):
    """Row-major index of device d over `axes` (the rank numbering of lax for a tuple of axes)."""
    r = 0
    for a in axes:
        r = r * SIZES[a] + coords(d)[a]
    return r


def inputs(shape, seed=0):
    x = np.random.default_rng(seed).standard_normal((8, *shape)).astype(np.float32)
    x[1].flat[3] = 300.0  # an outlier in one rank's block
    x[7].flat[-1] = -1e4
    return x


def partial_sums(x, outer):
    """s_o: the float64 sums of x over the ranks that share outer coordinates o (the exact inner hop)."""
    groups = {}
    for d in range(8):
        groups.setdefault(linear(d, outer), []).append(x[d].astype(np.float64))
    return np.stack([np.sum(groups[o], axis=0) for o in sorted(groups)])


def outer_bound(s, name, *, second_hop: bool):
    """sum_o e(s_o) (+ e(sum_o s'_o) for all_reduce), per element of the flat vector, + float32 summation."""
    flat = s.reshape(s.shape[0], -1)
    if name == "bf16":
        first = sum(ref.bound(v, "bf16") for v in flat)
        second = ref.bound(np.stack([ref.roundtrip(v, "bf16") for v in flat]).sum(0), "bf16")
    else:
        first = sum(ref.bound(v, name, B) for v in flat)
        second = ref.bound(np.stack([ref.roundtrip(v, name, B) for v in flat]).sum(0), name, B)
    return first + (second if second_hop else 0) + 16 * 2.0 ** -23 * np.abs(flat).sum(0)


@pytest.mark.parametrize("name,fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("axes,outer", [(("x", "y"), ("x",)), (("x", "y"), ("y",)), (("y", "x"), ("x",))])
def test_all_reduce_is_within_the_outer_hops_bound_and_identical_on_every_rank(name, fmt, axes, outer):
    x = inputs((4, 2 * B))
    f = sharded(per_rank(lambda v: jaxcoll.all_reduce(v, axes, compression=fmt, compress_axes=outer)), "2x4")
    y = np.asarray(f(put(x, "2x4")))
    assert y.shape == x.shape and np.all(y == y[0]), "every rank gathers the same bytes"
    err = np.abs(y[0].astype(np.float64) - x.astype(np.float64).sum(0)).reshape(-1)
    bound = outer_bound(partial_sums(x, outer), name, second_hop=True)
    assert np.all(err <= bound), np.max(err - bound)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_a_half_precision_all_reduce_is_the_float32_sum_rounded_once_and_gathers_in_its_dtype(dtype):
    x = inputs((4, 2 * B)).astype(dtype)
    body = per_rank(lambda v: jaxcoll.all_reduce(v, ("x", "y"), compression=Int8(B), compress_axes="x"))
    y = np.asarray(sharded(body, "2x4")(put(x, "2x4")))
    assert y.dtype == np.dtype(dtype)
    # The float32 path on the same (half-precision) values, rounded once to dtype: the same result.
    f32 = sharded(per_rank(lambda v: jaxcoll.all_reduce(v, ("x", "y"), compression=Int8(B), compress_axes="x")),
                  "2x4")(put(x.astype(np.float32), "2x4"))
    np.testing.assert_array_equal(y, np.asarray(f32).astype(dtype))
    # The gather of values (the inner hop over the fast axis y; the outer one carries int8 codes) is in dtype,
    # not float32: half the bytes.
    jaxpr = str(jax.make_jaxpr(sharded(body, "2x4"))(put(x, "2x4")))
    gathered = re.findall(r"\w+:(\w+)\[[^\]]*\]\S* = jaxcoll_all_gather", jaxpr)
    values = [t for t in gathered if t[0] in "fb"]
    assert values == [{jnp.bfloat16: "bf16", jnp.float16: "f16"}[dtype]], gathered


@pytest.mark.parametrize("name,fmt", FORMATS[:2], ids=IDS[:2])
def test_values_that_cancel_within_the_inner_axes_are_exact(name, fmt):
    # Within each host (x), the 4 local ranks (y) hold v, -v, w, -w: the exact inner hop sums them to 0, which
    # encodes exactly. The flat compressed path encodes each rank's values and is not exact.
    v = np.random.default_rng(1).standard_normal((4, 2, 4 * B)).astype(np.float32)
    x = np.stack([v[2 * h + k // 2] * (1 if k % 2 == 0 else -1) for h in range(2) for k in range(4)])
    x = x.reshape(8, -1)
    run = lambda c: np.asarray(sharded(per_rank(lambda t: jaxcoll.all_reduce(t, ("x", "y"), **c)), "2x4")(  # noqa
        put(x, "2x4")))
    np.testing.assert_array_equal(run({"compression": fmt, "compress_axes": "x"}), np.zeros_like(x))
    assert np.any(run({"compression": fmt}) != 0), "the flat path is lossy here: the test can tell them apart"


def test_all_reduce_pads_a_size_that_no_inner_chunk_of_whole_blocks_divides():
    x = inputs((3 * B,))  # 192 elements: not 4 chunks of whole 64-blocks
    f = sharded(per_rank(lambda v: jaxcoll.all_reduce(v, ("x", "y"), compression=Int8(B), compress_axes="x")),
                "2x4")
    y = np.asarray(f(put(x, "2x4")))
    err = np.abs(y[0].astype(np.float64) - x.astype(np.float64).sum(0))
    assert np.all(err <= outer_bound(partial_sums(np.pad(x, ((0, 0), (0, 64))), ("x",)), "int8",
                                     second_hop=True)[:3 * B])


def test_compress_axes_equal_to_axis_name_is_the_flat_path():
    x = inputs((2 * B,))
    run = lambda c: np.asarray(sharded(per_rank(  # noqa: E731
        lambda v: jaxcoll.all_reduce(v, ("x", "y"), compression=Int8(B), **c)), "2x4")(put(x, "2x4")))
    np.testing.assert_array_equal(run({"compress_axes": ("y", "x")}), run({}))


@pytest.mark.parametrize("name,fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("axes,outer", [(("x", "y"), ("x",)), (("x", "y"), ("y",)), (("y", "x"), ("x",))])
@pytest.mark.parametrize("dim,tiled", [(0, True), (1, True), (1, False)])
def test_reduce_scatter_gives_psum_scatters_pieces_within_the_outer_hops_bound(name, fmt, axes, outer, dim, tiled):
    shape = [8 * B, 2] if dim == 0 else [B, 8 if not tiled else 16]
    x = inputs(shape)
    f = sharded(per_rank(lambda v: jaxcoll.reduce_scatter(v, axes, scatter_dimension=dim, tiled=tiled,
                                                          compression=fmt, compress_axes=outer)), "2x4")
    y = np.asarray(f(put(x, "2x4")))
    exact = np.asarray(sharded(per_rank(lambda v: lax.psum_scatter(v, axes, scatter_dimension=dim, tiled=tiled)),
                               "2x4")(put(x, "2x4")))
    assert y.shape == exact.shape
    moved = np.moveaxis(x, dim + 1, 1).reshape(8, 8, -1)  # (device, piece, elements)
    for d in range(8):
        r = linear(d, axes)  # device d holds piece r of the sum, as lax.psum_scatter
        got = np.moveaxis(y[d], dim, 0).reshape(-1) if tiled else y[d].reshape(-1)
        truth = moved[:, r].astype(np.float64).sum(0)
        bound = outer_bound(partial_sums(moved[:, r], outer), name, second_hop=name == "bf16")
        assert np.all(np.abs(got - truth) <= bound), (d, np.max(np.abs(got - truth) - bound))


def test_derivatives_are_the_exact_collectives():
    x = put(inputs((8 * B,)), "2x4")
    w = jnp.arange(8 * B, dtype=jnp.float32)

    def loss(reduce, v):
        out = reduce(v)
        return jnp.sum(w[:out.shape[-1]] * out)

    def grads(reduce):
        return sharded(jax.grad(lambda v: loss(reduce, v)), "2x4")(x)

    for c in (Int8(B), Fp8(B), "bf16"):
        np.testing.assert_array_equal(
            grads(lambda v: jaxcoll.all_reduce(v, ("x", "y"), compression=c, compress_axes="x")),
            grads(lambda v: lax.psum(v, ("x", "y"))))
        np.testing.assert_array_equal(
            grads(lambda v: jaxcoll.reduce_scatter(v, ("x", "y"), scatter_dimension=1, tiled=True,
                                                  compression=c, compress_axes="x")),
            grads(lambda v: lax.psum_scatter(v, ("x", "y"), scatter_dimension=1, tiled=True)))


def test_vmap_and_scan_run_it_per_slice():
    x = inputs((3, 2 * B))

    def reduce(row):
        return jaxcoll.all_reduce(row, ("x", "y"), compression=Int8(B), compress_axes="x")

    def body(v):  # v: (1, 3, 2B) on each rank
        mapped = jax.vmap(reduce)(v[0])
        scanned = lax.scan(lambda c, row: (c, reduce(row)), 0, v[0])[1]
        looped = jnp.stack([reduce(v[0, j]) for j in range(3)])
        return mapped[None], scanned[None], looped[None]

    mapped, scanned, looped = (np.asarray(a) for a in sharded(body, "2x4")(put(x, "2x4")))
    np.testing.assert_array_equal(mapped, looped)
    np.testing.assert_array_equal(scanned, looped)


def test_result_is_invariant_like_psum():
    x = inputs((256,))
    f = jax.jit(jax.shard_map(
        lambda v: jaxcoll.all_reduce(v[0], ("x", "y"), compression="int8", compress_axes="x"),
        mesh=mesh("2x4"), in_specs=P(("x", "y")), out_specs=P()))  # P() holds only for an invariant value
    assert f(put(x, "2x4")).shape == (256,)


def trace(fn, x=np.ones((8, 256), np.float32)):
    return jax.jit(jax.shard_map(fn, mesh=mesh("2x4"), in_specs=P(("x", "y")), out_specs=P(("x", "y")))).trace(
        put(x, "2x4"))


@pytest.mark.parametrize("compress_axes,match", [
    ("z", r"compress_axes='z' must name one or more distinct axes of axis_name=\('x', 'y'\)"),
    ((), r"compress_axes=\(\) must name"),
    (("x", "x"), r"compress_axes=\('x', 'x'\) must name"),
])
def test_compress_axes_outside_axis_name_is_refused(compress_axes, match):
    with pytest.raises(ValueError, match=match):
        trace(lambda v: jaxcoll.all_reduce(v, ("x", "y"), compression="int8", compress_axes=compress_axes))


def test_compress_axes_without_a_block_or_bf16_compression_is_refused():
    with pytest.raises(ValueError, match="compress_axes='x' needs a compression, got compression=None"):
        trace(lambda v: jaxcoll.all_reduce(v, ("x", "y"), compress_axes="x"))
    with pytest.raises(ValueError, match="compress_axes='x' needs a compression"):
        trace(lambda v: jaxcoll.reduce_scatter(v, ("x", "y"), scatter_dimension=1, tiled=True, compress_axes="x"))
    with pytest.raises(ValueError, match="compress_axes='x' cannot be combined with compression=TopK"):
        trace(lambda v: jaxcoll.all_reduce(v, ("x", "y"), compression=jaxcoll.compress.TopK(k=4), compress_axes="x"))
    with pytest.raises(ValueError, match="algorithm='ring' cannot be combined with compress_axes='x'"):
        trace(lambda v: jaxcoll.all_reduce(v, ("x", "y"), algorithm="ring", compression="bf16", compress_axes="x"))
    with pytest.raises(ValueError, match="op='adasum' cannot be combined with compress_axes='x'"):
        trace(lambda v: jaxcoll.all_reduce(v, ("x", "y"), op="adasum", compress_axes="x"))
