"""The wire formats against numpy: decoded values equal the numpy reference of each format and stay within the
per-element error bound stated in jaxcoll/compress/formats.py, on adversarial inputs."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import compress_reference as ref
from jaxcoll.compress import Bf16, Fp8, Int8, quantize
from jaxcoll.compress.formats import roundtrip

BLOCK = 64


def adversarial(rng):
    """Named float32 vectors of 4 blocks of 64: the cases a quantizer gets wrong."""
    normal = rng.standard_normal(4 * BLOCK).astype(np.float32)
    outlier = normal.copy() * 1e-3
    outlier[5], outlier[70] = 1e30, -3e4  # one huge element per block: the rest of its block is crushed
    zeros = np.zeros(4 * BLOCK, np.float32)
    zeros[BLOCK + 3] = -0.0
    denormal = normal * np.float32(1e-39)  # every element subnormal
    mixed = normal.copy()
    mixed[BLOCK:2 * BLOCK] *= np.float32(1e-39)  # one block of subnormals among normal blocks
    mixed[2 * BLOCK] = np.float32(2.0 ** -125)  # a block whose absmax is barely normal
    huge = normal / np.abs(normal).max() * np.float32(3.0e38)  # near float32's largest (bf16 max 3.39e38)
    ties = (np.arange(4 * BLOCK, dtype=np.float32) - 128) / 2  # exact halves: round-half-even codes
    return {"normal": normal, "outlier": outlier, "zeros": zeros, "denormal": denormal, "mixed": mixed,
            "huge": huge, "ties": ties}


def run(x, fmt):
    return np.asarray(jax.jit(lambda v: roundtrip(v, fmt))(jnp.asarray(x)))


FORMATS = [("int8", Int8(BLOCK)), ("fp8", Fp8(BLOCK)), ("bf16", Bf16())]


@pytest.mark.parametrize("name,fmt", FORMATS, ids=[f[0] for f in FORMATS])
@pytest.mark.parametrize("case", ["normal", "outlier", "zeros", "denormal", "mixed", "huge", "ties"])
def test_roundtrip_is_the_numpy_reference_and_within_the_bound(name, fmt, case):
    x = adversarial(np.random.default_rng(0))[case]
    y = run(x, fmt)
    # XLA:CPU may divide by a constant as a multiply by its reciprocal: scales agree to a few ulps.
    np.testing.assert_allclose(y, ref.roundtrip(x, name, BLOCK), rtol=2.0 ** -20, atol=0)
    err = np.abs(y.astype(np.float64) - x.astype(np.float64))
    assert np.all(err <= ref.bound(x, name, BLOCK)), np.max(err - ref.bound(x, name, BLOCK))
    assert np.all(np.isfinite(y))


def test_zero_blocks_decode_to_zeros_exactly():
    y = run(np.zeros(2 * BLOCK, np.float32), Int8(BLOCK))
    assert np.all(y == 0) and not np.any(np.isnan(y))


@pytest.mark.parametrize("name,fmt", FORMATS[:2], ids=["int8", "fp8"])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_non_finite_element_makes_its_block_nan_and_leaves_other_blocks(name, fmt, bad):
    x = np.random.default_rng(1).standard_normal(3 * BLOCK).astype(np.float32)
    x[BLOCK + 7] = bad
    y = run(x, fmt)
    assert np.all(np.isnan(y[BLOCK:2 * BLOCK]))
    others = np.r_[0:BLOCK, 2 * BLOCK:3 * BLOCK]
    assert np.all(np.abs(y[others] - x[others]) <= ref.bound(x, name, BLOCK)[others])


def test_bf16_keeps_inf_and_nan_where_they_are():
    x = np.array([1.5, np.inf, -np.inf, np.nan, 3.0], np.float32)
    y = run(x, Bf16())
    np.testing.assert_array_equal(y, x.astype(jnp.bfloat16).astype(np.float32))


def test_int8_outlier_error_is_half_a_step_of_the_outlier_scale():
    x = adversarial(np.random.default_rng(2))["outlier"]
    y = run(x, Int8(BLOCK))
    # The small elements of the outlier's block are within half a step (1e30 / 254) of their value: zeros.
    assert np.all(y[:BLOCK][np.arange(BLOCK) != 5] == 0)
    assert y[5] == np.float32(1e30) or abs(float(y[5]) - 1e30) <= 1e30 / 254


def test_quantize_is_straight_through():
    x = jnp.asarray(np.random.default_rng(3).standard_normal(256).astype(np.float32))
    w = jnp.arange(256, dtype=jnp.float32)
    grad = jax.grad(lambda v: jnp.sum(w * quantize(v, "int8")))(x)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(w))
    np.testing.assert_allclose(np.asarray(quantize(x, "int8")), ref.roundtrip(np.asarray(x), "int8", 256),
                               rtol=2.0 ** -20, atol=0)


def test_quantize_keeps_the_dtype_of_x():
    x = jnp.ones((4, 64), jnp.bfloat16)
    y = quantize(x, Int8(64))
    assert y.dtype == jnp.bfloat16 and y.shape == (4, 64)


def test_wire_bytes_count_codes_and_scales():
    assert Int8(256).wire_bytes(1024) == 1024 + 4 * 4
    assert Fp8(128).wire_bytes(1024) == 1024 + 4 * 8
    assert Bf16().wire_bytes(1024) == 2048


@pytest.mark.parametrize("bad", [0, -4, 2.5, True])
def test_block_size_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=f"block_size={bad!r}"):
        Int8(bad)


def test_quantize_errors_name_the_argument():
    with pytest.raises(TypeError, match="dtype=int32"):
        quantize(jnp.ones(256, jnp.int32), "int8")
    with pytest.raises(ValueError, match="compression='int4'"):
        quantize(jnp.ones(256), "int4")
    with pytest.raises(ValueError, match="block_size=256 .* does not divide the 100 elements"):
        quantize(jnp.ones(100), "int8")


def test_fp8_codes_are_e4m3_bits_rounded_to_nearest_even():
    # Every e4m3 value, the midpoints between neighbours (ties go to the even code) and points beside them.
    values = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    finite = np.unique(values[np.isfinite(values)])
    mids = (finite[:-1] + finite[1:]) / 2
    y = np.concatenate([finite, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf), [-0.0, 1e-30]])
    y = y[np.abs(y) <= 448].astype(np.float32)
    fmt = Fp8(BLOCK)
    codes = np.asarray(jax.jit(fmt.round)(jnp.asarray(y)))
    np.testing.assert_array_equal(codes, y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
    back = np.asarray(jax.jit(fmt.values)(jnp.arange(256, dtype=jnp.uint8)))
    both = np.isfinite(values)
    np.testing.assert_array_equal(back[both], values[both])


_BIG = float(np.float32(3e38))  # below bf16's largest finite value (3.39e38), above which bf16 rounds to inf
_TINY = float(np.float32(1e-36))
_mixed = st.one_of(st.floats(min_value=-_BIG, max_value=_BIG, width=32),
                   st.floats(min_value=-_TINY, max_value=_TINY, width=32),  # subnormals and near-zero scales
                   st.sampled_from([0.0, -0.0]), st.floats(min_value=-1.0, max_value=1.0, width=32))


@given(x=hnp.arrays(np.float32, (2 * BLOCK,), elements=_mixed), name=st.sampled_from(["int8", "fp8", "bf16"]))
def test_any_finite_input_stays_within_the_bound(x, name):
    fmt = dict(FORMATS)[name]
    y = run(x, fmt)
    err = np.abs(y.astype(np.float64) - x.astype(np.float64))
    assert np.all(err <= ref.bound(x, name, BLOCK))
    np.testing.assert_allclose(y, ref.roundtrip(x, name, BLOCK), rtol=2.0 ** -20, atol=0)
