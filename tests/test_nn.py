"""jaxcoll.nn.dense under jax.jit with shardings: equal to x @ w (values and gradients) in a Megatron layout,
partitioned onto jaxcoll's fused ops instead of XLA's collectives."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcoll import nn

XLA_COLLECTIVE = re.compile(r"\b(all-gather|reduce-scatter|all-reduce|collective-permute|all-to-all)(-start)?\(")


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def mlp(mesh, x, w1, w2, matmul, seq_parallel_out=True):
    """Column-parallel then row-parallel layer; activations sequence-sharded between blocks."""
    s = lambda *spec: NamedSharding(mesh, P(*spec))
    h = jax.lax.with_sharding_constraint(matmul(x, w1), s("data", None, "model"))
    y = matmul(jax.nn.gelu(h), w2)
    return jax.lax.with_sharding_constraint(y, s("data", "model" if seq_parallel_out else None, None))


@pytest.fixture(scope="module")
def operands(mesh):
    rng = np.random.default_rng(0)
    s = lambda *spec: NamedSharding(mesh, P(*spec))
    x = jax.device_put(rng.normal(size=(4, 16, 8)).astype(np.float32), s("data", "model", None))
    w1 = jax.device_put(rng.normal(size=(8, 32)).astype(np.float32) / 3, s(None, "model"))
    w2 = jax.device_put(rng.normal(size=(32, 8)).astype(np.float32) / 6, s("model", None))
    return x, w1, w2


@pytest.mark.parametrize("seq_parallel_out", [True, False])
def test_dense_megatron_mlp_equals_matmul_with_gradients(mesh, operands, seq_parallel_out):
    f = lambda m: jax.jit(lambda *a: mlp(mesh, *a, m, seq_parallel_out))
    np.testing.assert_allclose(f(nn.dense)(*operands), f(jnp.matmul)(*operands), rtol=1e-4, atol=1e-4)
    g = lambda m: jax.jit(jax.grad(lambda *a: jnp.sum(mlp(mesh, *a, m, seq_parallel_out) ** 2), argnums=(0, 1, 2)))
    for a, b in zip(g(nn.dense)(*operands), g(jnp.matmul)(*operands)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)


def test_dense_layers_compile_to_jaxcoll_custom_calls_not_xla_collectives(mesh, operands):
    fwd = jax.jit(lambda *a: mlp(mesh, *a, nn.dense))
    train = jax.jit(jax.grad(lambda *a: jnp.sum(mlp(mesh, *a, nn.dense) ** 2), argnums=(0, 1, 2)))
    assert jax.config.jax_use_shardy_partitioner  # the partitioner that reads dense's sharding_rule
    for f in (fwd, train):
        lowered = f.lower(*operands)
        # Shardy sees the rule "... s h, h f -> ... t f" on the partitioned call: the sequence dims are factors
        # of their own (j, m), so the result's sequence sharding is not tied to x's.
        assert re.search(r"sdy.sharding_rule = #sdy.op_sharding_rule<\(\[i, j, k\], \[k, l\]\)->\(\[i, m, l\]\)",
                         lowered.as_text())
        hlo = lowered.compile().as_text()
        assert re.search(r'custom_call_target="jaxcoll_', hlo), "no jaxcoll custom call in the compiled program"
        assert not XLA_COLLECTIVE.search(hlo), f"XLA collective in the compiled program: {XLA_COLLECTIVE.search(hlo)}"


def test_dense_checks_contraction_dimensions(mesh):
    with pytest.raises(ValueError, match=r"x.shape=\(2, 4, 8\).*w.shape=\(6, 3\)"):
        jax.jit(nn.dense)(jnp.zeros((2, 4, 8)), jnp.zeros((6, 3)))
