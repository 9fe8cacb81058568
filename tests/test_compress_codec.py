"""The native codec (csrc/codec.cc through jaxcoll.compress.codec) against formats.py's jax.numpy definition run by
XLA:CPU, bit for bit (NaN payloads and signed zeros included), on adversarial inputs; against the numpy reference
of docs/compression.md; and under vmap, padding, bad shapes and a GPU lowering."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import compress_reference as ref
import jaxcoll
from jaxcoll.compress import Bf16, Fp8, Int8, codec
from jaxcoll.compress.formats import roundtrip
from jaxcoll.plan import abi
from sharded import mesh, put

FORMATS = [Int8(64), Fp8(64), Int8(256), Fp8(32), Int8(1000), Fp8(4096)]  # tiles of several blocks, and one
IDS = [f"{f.name}-{f.block_size}" for f in FORMATS]
F32_TINY = np.float32(2.0 ** -126)


def unit_scale_absmax(code_max):
    """A float32 absmax whose scale absmax * float32(1/code_max) is exactly 1: in that block x * (1/s) is x, so
    chosen x land exactly on rounding ties."""
    a = np.float32(code_max)
    for _ in range(64):
        if a * (np.float32(1) / np.float32(code_max)) == np.float32(1):
            return a
        a = np.nextafter(a, np.float32(np.inf))
    raise AssertionError("no float32 absmax near code_max has a unit scale")


def adversarial(fmt, rng):
    """Named float32 vectors of 8 blocks: the cases a quantizer gets wrong."""
    b = fmt.block_size
    n = 8 * b
    normal = rng.standard_normal(n).astype(np.float32)
    outlier = normal * np.float32(1e-3)
    outlier[5], outlier[b + 1], outlier[3 * b] = 1e30, -3e4, 3.0e38
    zeros = np.zeros(n, np.float32)
    zeros[b:2 * b] = -0.0
    subnormal = normal * np.float32(1e-39)
    mixed = normal.copy()
    mixed[b:2 * b] *= np.float32(1e-39)  # a block of subnormals among normal blocks
    mixed[2 * b] = np.float32(2.0 ** -125)  # a block whose absmax is barely normal
    mixed[3 * b:4 * b] = np.float32(2.0 ** -120) * normal[:b]  # scales near the smallest normal
    mixed[4 * b + 1] = np.float32(-1e-40)  # one subnormal beside normal values
    nonfinite = normal.copy()
    nonfinite[3], nonfinite[b + 7], nonfinite[2 * b], nonfinite[5 * b + 9] = np.inf, -np.inf, np.nan, -np.nan
    # Ties: blocks whose scale is exactly 1, so the scaled values are the elements themselves.
    top = unit_scale_absmax(fmt.code_max)
    if fmt.name == "int8":
        halves = (np.arange(n, dtype=np.float32) % 255 - 127) + np.float32(0.5)
        ties = np.clip(halves, -126.5, 126.5)
    else:
        values = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        finite = np.unique(values[np.isfinite(values)])
        mids = (finite[:-1] + finite[1:]) / 2  # midpoints between neighbouring e4m3 values, subnormal and normal
        edge = [2.0 ** -6, np.nextafter(np.float32(2.0 ** -6), 0), 7 * 2.0 ** -9, 15 * 2.0 ** -10, 2.0 ** -10,
                np.nextafter(np.float32(15 * 2.0 ** -10), 1), 447.9, 432.0, 440.0]  # e4m3's normal/subnormal edge
        pool = np.concatenate([mids, -mids, np.asarray(edge, np.float32), -np.asarray(edge, np.float32)])
        ties = np.resize(pool, n).astype(np.float32)
    ties[::b] = top  # every block's absmax: scale 1
    return {"normal": normal, "outlier": outlier, "zeros": zeros, "subnormal": subnormal, "mixed": mixed,
            "nonfinite": nonfinite, "ties": ties}


CASES = ["normal", "outlier", "zeros", "subnormal", "mixed", "nonfinite", "ties"]


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint32) if a.dtype == np.float32 else a


def assert_bitwise(native, reference):
    for got, want in zip(jax.tree_util.tree_leaves(native), jax.tree_util.tree_leaves(reference)):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(bits(got), bits(want))


def native_calls(f, *args):
    return jax.jit(f).lower(*args).as_text().count("jaxcoll_codec_")


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("case", CASES)
def test_encode_and_decode_are_the_jnp_formats_bit_for_bit(fmt, case):
    x = adversarial(fmt, np.random.default_rng(1))[case].reshape(2, -1)
    assert native_calls(lambda v: codec.encode(fmt, v), x) == 1
    codes, scales = jax.jit(lambda v: codec.encode(fmt, v))(x)
    want_codes, want_scales = (np.asarray(a) for a in jax.jit(fmt.encode)(x))
    # Every block holding an inf or a NaN has a NaN scale and zero codes (formats.py's rule, the numpy reference's).
    bad = ~np.isfinite(ref.scales(x, fmt.name, fmt.block_size)).reshape(scales.shape)
    np.testing.assert_array_equal(np.isnan(scales), bad)
    assert not np.any(np.asarray(codes).reshape(*bad.shape, -1)[bad])
    assert_bitwise((codes, scales), (want_codes, want_scales))
    assert_bitwise(jax.jit(lambda c, s: codec.decode(fmt, c, s))(codes, scales), jax.jit(fmt.decode)(codes, scales))


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("case", CASES)
def test_the_native_round_trip_is_the_numpy_reference(fmt, case):
    x = adversarial(fmt, np.random.default_rng(2))[case]
    codes, scales = jax.jit(lambda v: codec.encode(fmt, v))(x)
    y = np.asarray(jax.jit(lambda c, s: codec.decode(fmt, c, s))(codes, scales))
    want = ref.roundtrip(x, fmt.name, fmt.block_size)
    # The reference divides by code_max where XLA:CPU multiplies by its reciprocal: scales agree to a few ulps.
    np.testing.assert_allclose(y, want, rtol=2.0 ** -20, atol=0)
    finite = np.isfinite(ref.bound(x, fmt.name, fmt.block_size))
    err = np.abs(y.astype(np.float64) - x.astype(np.float64))
    assert np.all(err[finite] <= ref.bound(x, fmt.name, fmt.block_size)[finite])
    assert np.all(np.isnan(y[~finite]))


def adversarial_rows(fmt, rng, batch, terms, blocks=6):
    """Codes of every byte and scales of every kind: zero, the smallest normal, near it, huge enough that the
    rows' sum overflows (inf, and inf - inf), NaN."""
    length = blocks * fmt.block_size
    codes = rng.integers(0, 256, (batch, terms, length), dtype=np.uint8).view(np.dtype(fmt.code_dtype))
    kinds = np.asarray([0.0, F32_TINY, 2.0 ** -120, 1.0, 3.0e35, np.nan, 7.5e-3, 1e30], np.float32)
    scales = kinds[rng.integers(0, len(kinds), (batch, terms, blocks))]
    scales[..., 0] = np.abs(rng.standard_normal((batch, terms))).astype(np.float32)
    return codes, scales


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("terms", [1, 2, 3, 8])
def test_decode_sum_is_the_jnp_sum_of_rows_in_order_bit_for_bit(fmt, terms):
    codes, scales = adversarial_rows(fmt, np.random.default_rng(terms), 2, terms)
    assert native_calls(lambda c, s: codec.decode_sum(fmt, c, s), codes, scales) == 1

    def jnp_sum(c, s):
        decoded = fmt.decode(c, s)
        part = decoded[..., 0, :]
        for p in range(1, terms):
            part = part + decoded[..., p, :]
        return part

    got = jax.jit(lambda c, s: codec.decode_sum(fmt, c, s))(codes, scales)
    assert_bitwise(got, jax.jit(jnp_sum)(codes, scales))
    fused = jax.jit(lambda c, s: codec.decode_sum_encode(fmt, c, s))(codes, scales)
    assert_bitwise(fused, jax.jit(lambda c, s: fmt.encode(jnp_sum(c, s)))(codes, scales))


@pytest.mark.parametrize("fmt", FORMATS[:2], ids=IDS[:2])
def test_decode_sum_is_the_float64_sum_of_the_reference_decoding_within_float32_rounding(fmt):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((8, 16 * fmt.block_size)) * np.float32(3)).astype(np.float32)
    codes, scales = jax.jit(lambda v: codec.encode(fmt, v))(x)
    got = np.asarray(jax.jit(lambda c, s: codec.decode_sum(fmt, c, s))(codes, scales)).astype(np.float64)
    decoded = np.stack([ref.roundtrip(v, fmt.name, fmt.block_size) for v in x]).astype(np.float64)
    # Each scale may differ from the reference's by a few ulps (see above), each of the 8 adds rounds once.
    tolerance = np.abs(decoded).sum(0) * (8 * 2.0 ** -24 + 2.0 ** -20)
    assert np.all(np.abs(got - decoded.sum(0)) <= tolerance)


@pytest.mark.parametrize("fmt", FORMATS[:2] + [Bf16()], ids=IDS[:2] + ["bf16"])
def test_roundtrip_is_the_formats_roundtrip_bit_for_bit(fmt):
    x = adversarial(Int8(64), np.random.default_rng(5))["mixed"]  # 8 blocks of 64: whole blocks for both
    assert_bitwise(jax.jit(lambda v: codec.roundtrip(fmt, v))(x), jax.jit(lambda v: roundtrip(v, fmt))(x))


@pytest.mark.parametrize("fmt", FORMATS[:2], ids=IDS[:2])
def test_padding_is_zero_blocks_and_decode_keeps_a_prefix(fmt):
    b = fmt.block_size
    x = np.random.default_rng(3).standard_normal(3 * b).astype(np.float32)
    codes, scales = jax.jit(lambda v: codec.encode(fmt, v, padded=5 * b))(x)
    want_codes, want_scales = jax.jit(fmt.encode)(x)
    assert_bitwise((codes[:3 * b], scales[:3]), (want_codes, want_scales))
    assert not np.any(np.asarray(codes[3 * b:])) and not np.any(np.asarray(scales[3:]))
    kept = 2 * b + 5
    y = jax.jit(lambda c, s: codec.decode(fmt, c, s, kept=kept))(codes, scales)
    assert_bitwise(y, np.asarray(jax.jit(fmt.decode)(want_codes, want_scales))[:kept])


@pytest.mark.parametrize("fmt", FORMATS[:2], ids=IDS[:2])
def test_vmap_runs_the_kernels_on_more_rows(fmt):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 2, 4 * fmt.block_size)).astype(np.float32)
    encoded = jax.jit(jax.vmap(lambda v: codec.encode(fmt, v)))(x)
    assert_bitwise(encoded, jax.jit(fmt.encode)(x))
    codes, scales = encoded
    # A batched operand beside an unbatched one: ffi_call broadcasts (vmap_method="broadcast_all").
    summed = jax.jit(jax.vmap(lambda c, s: codec.decode_sum(fmt, c, s), in_axes=(0, None)))(codes, scales[0])
    want = jax.jit(lambda c, s: fmt.decode(c, s)[:, 0] + fmt.decode(c, s)[:, 1])(codes, jnp.broadcast_to(
        scales[0], scales.shape))
    assert_bitwise(summed, want)


WIRE_FORMATS = FORMATS[:2] + [Int8(9)]  # blocks of 9: rows of 18 codes, then 2 zero bytes before the scales
WIRE_IDS = IDS[:2] + ["int8-9"]


@pytest.mark.parametrize("fmt", WIRE_FORMATS, ids=WIRE_IDS)
@pytest.mark.parametrize("case", CASES)
def test_the_wire_form_is_the_codes_zeros_to_a_multiple_of_4_then_the_scales_bytes(fmt, case):
    x = adversarial(fmt, np.random.default_rng(6))[case]
    x = x[:3 * fmt.block_size * (x.size // (3 * fmt.block_size))].reshape(3, -1)  # 3 rows of whole blocks
    length = x.shape[-1]
    codes, scales = (np.asarray(a) for a in jax.jit(fmt.encode)(x))
    at = -(-length // 4) * 4
    want = np.concatenate([codes.view(np.uint8), np.zeros((3, at - length), np.uint8), scales.view(np.uint8)],
                          axis=-1).view(codes.dtype)
    assert native_calls(lambda v: codec.encode_wire(fmt, v), x) == 1
    wire = jax.jit(lambda v: codec.encode_wire(fmt, v))(x)
    assert wire.shape == (3, codec.wire_row_bytes(fmt, length))
    assert_bitwise(wire, want)
    assert_bitwise(jax.jit(lambda v: codec.jnp_encode_wire(fmt, v))(x), want)
    assert_bitwise(jax.jit(jax.vmap(lambda v: codec.encode_wire(fmt, v)))(x.reshape(3, 1, -1)), want[:, None])


def as_wire(codes, scales):
    """numpy's wire rows of (codes, scales): the codes, zero bytes to a multiple of 4, the scales' bytes."""
    codes, scales = np.asarray(codes), np.asarray(scales)
    gap = np.zeros(codes.shape[:-1] + (-codes.shape[-1] % 4,), np.uint8)
    return np.concatenate([codes.view(np.uint8), gap, scales.view(np.uint8)], axis=-1).view(codes.dtype)


@pytest.mark.parametrize("fmt", WIRE_FORMATS, ids=WIRE_IDS)
@pytest.mark.parametrize("terms", [1, 2, 3])
def test_decode_sum_of_wire_rows_is_decode_sum_bit_for_bit(fmt, terms):
    codes, scales = adversarial_rows(fmt, np.random.default_rng(10 + terms), 2, terms)
    length = codes.shape[-1]
    wire = as_wire(codes, scales)
    want = jax.jit(lambda c, s: codec.decode_sum(fmt, c, s))(codes, scales)
    assert native_calls(lambda w: codec.decode_sum_wire(fmt, w, length), wire) == 1
    assert_bitwise(jax.jit(lambda w: codec.decode_sum_wire(fmt, w, length))(wire), want)
    assert_bitwise(jax.jit(lambda w: codec.jnp_decode_sum_wire(fmt, w, length))(wire), want)
    # The sum encoded again, as one wire row: decode_sum_encode's codes and scales, gap bytes zero.
    want = as_wire(*jax.jit(lambda c, s: codec.decode_sum_encode(fmt, c, s))(codes, scales))
    assert native_calls(lambda w: codec.decode_sum_encode_wire(fmt, w, length), wire) == 1
    assert_bitwise(jax.jit(lambda w: codec.decode_sum_encode_wire(fmt, w, length))(wire), want)
    assert_bitwise(jax.jit(lambda w: codec.jnp_encode_wire(fmt, codec.jnp_decode_sum_wire(fmt, w, length)))(wire),
                   want)


@pytest.mark.parametrize("fmt", WIRE_FORMATS, ids=WIRE_IDS)
@pytest.mark.parametrize("kept", ["all", "a row and a part"])
def test_decoding_wire_rows_gives_the_rows_values_one_after_another(fmt, kept):
    codes, scales = adversarial_rows(fmt, np.random.default_rng(20), 2, 3)
    length = codes.shape[-1]
    k = 3 * length if kept == "all" else length + fmt.block_size + 1
    want = np.asarray(jax.jit(fmt.decode)(codes, scales)).reshape(2, -1)[:, :k]
    wire = as_wire(codes, scales)
    assert native_calls(lambda w: codec.decode_wire(fmt, w, length, k), wire) == 1
    assert_bitwise(jax.jit(lambda w: codec.decode_wire(fmt, w, length, k))(wire), want)
    assert_bitwise(jax.jit(lambda w: codec.jnp_decode_wire(fmt, w, length, k))(wire), want)


def test_other_platforms_lower_the_jnp_formats():
    # XLA:GPU fuses the jax.numpy formats well; only the CPU lowering calls the native kernels.
    fmt = Int8(64)
    f = jax.jit(lambda v: codec.decode_sum_encode(fmt, *codec.encode(fmt, v.reshape(2, -1))))
    text = jax.export.export(f, platforms=["cuda"])(np.ones((2, 128), np.float32)).mlir_module()
    assert "jaxcoll_codec" not in text and "custom_call" not in text
    wire = jax.jit(lambda v: codec.decode_sum_wire(fmt, codec.encode_wire(fmt, v), 64))
    text = jax.export.export(wire, platforms=["cuda"])(np.ones((2, 64), np.float32)).mlir_module()
    assert "jaxcoll_codec" not in text and "custom_call" not in text


@pytest.mark.parametrize("target,operands,results,match", [
    (abi.CODEC_ENCODE_TARGET, [((100,), np.float32)], [((100,), np.int8), ((1,), np.float32)],
     "block_size=64 must be positive and divide the codes' last axis of 100"),
    (abi.CODEC_ENCODE_TARGET, [((64,), np.float32)], [((64,), np.int16), ((1,), np.float32)],
     "codes must be int8 .* or uint8"),
    (abi.CODEC_DECODE_SUM_TARGET, [((2, 128), np.int8), ((2, 3), np.float32)], [((128,), np.float32)],
     r"need at least one row and one scale per block of block_size=64, got scales \(2, 3\)"),
    (abi.CODEC_ENCODE_WIRE_TARGET, [((128,), np.float32)], [((128,), np.int8)],
     r"wire rows of 128 codes in blocks of block_size=64 hold 136 bytes, got \(128,\)"),
    (abi.CODEC_DECODE_SUM_WIRE_TARGET, [((2, 130), np.int8)], [((128,), np.float32)],
     r"wire rows of 128 codes in blocks of block_size=64 hold 136 bytes, got \(2, 130\)"),
    (abi.CODEC_DECODE_SUM_ENCODE_WIRE_TARGET, [((2, 136), np.int8)], [((130,), np.int8)],
     r"the result \(130,\) must be the wire rows \(2, 136\) without their row axis"),
    (abi.CODEC_DECODE_WIRE_TARGET, [((2, 136), np.int8)], [((257,), np.float32)],
     r"the result \(257,\) must be .* at most their 256 values"),
])
def test_the_kernels_refuse_shapes_that_do_not_fit_naming_them(target, operands, results, match):
    call = jax.ffi.ffi_call(target, [jax.ShapeDtypeStruct(s, d) for s, d in results])
    args = [jnp.zeros(s, d) for s, d in operands]
    length = {abi.CODEC_DECODE_SUM_ENCODE_WIRE_TARGET: 128, abi.CODEC_DECODE_WIRE_TARGET: 128}
    attributes = {"length": np.int64(length[target])} if target in length else {}
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(jax.jit(lambda *a: call(*a, block_size=np.int64(64), **attributes))(*args))



@pytest.mark.parametrize("collective,targets", [
    ("all_reduce", ["jaxcoll_codec_encode_wire", "jaxcoll_codec_decode_sum_encode_wire", "jaxcoll_codec_decode_wire"]),
    ("reduce_scatter", ["jaxcoll_codec_encode_wire", "jaxcoll_codec_decode_sum_wire"]),
    ("all_gather", ["jaxcoll_codec_encode_wire", "jaxcoll_codec_decode_wire"]),
])
def test_the_quantized_collectives_run_the_native_kernels_on_cpu(collective, targets):
    call = {"all_reduce": lambda v: jaxcoll.all_reduce(v, "i", compression="int8"),
            "reduce_scatter": lambda v: jaxcoll.reduce_scatter(v, "i", compression="int8", tiled=True),
            "all_gather": lambda v: jaxcoll.all_gather(v, "i", compression="int8", tiled=True)}[collective]
    f = jax.jit(jax.shard_map(call, mesh=mesh("1d8"), in_specs=P("i"), out_specs=P("i"), check_vma=False))
    text = f.lower(put(np.ones((8 * 2048,), np.float32), "1d8")).as_text()
    assert sorted(set(re.findall(r"@(jaxcoll_codec_\w+)", text))) == sorted(targets)


def test_a_quantized_all_reduce_over_2_ranks_moves_the_wire_form_in_one_gather():
    # Over 2 ranks the two qgZ hops send what one gather of both encoded x sends (quantized._gather_and_sum).
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.all_reduce(v, "x", compression="int8"), mesh=mesh("2x4"),
                              in_specs=P(("x", "y")), out_specs=P(("x", "y")), check_vma=False))
    text = f.lower(put(np.ones((8 * 2048,), np.float32), "2x4")).as_text()
    assert sorted(set(re.findall(r"@(jaxcoll_codec_\w+)", text))) == ["jaxcoll_codec_decode_sum_wire",
                                                                       "jaxcoll_codec_encode_wire"]
    assert len(re.findall(r"@jaxcoll_all_gather", text)) == 1 and "jaxcoll_all_to_all" not in text


def test_a_quantized_reduce_scatter_moves_the_wire_form_in_one_all_to_all():
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.reduce_scatter(v, "i", compression="int8", tiled=True),
                              mesh=mesh("1d8"), in_specs=P("i"), out_specs=P("i"), check_vma=False))
    text = f.lower(put(np.ones((8 * 2048,), np.float32), "1d8")).as_text()
    assert len(re.findall(r"@jaxcoll_all_to_all", text)) == 1
