"""jaxcoll.nn.dense under jax.jit with shardings: equal to x @ w (values and gradients) in a Megatron layout,
partitioned onto jaxcoll's fused ops instead of XLA's collectives."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
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


# -- jaxcoll.nn.norm, jaxcoll.nn.dense_norm ----------------------------------------------------------------------


def norm_reference(h, scale, offset, norm, eps=1e-6):
    """RMSNorm / LayerNorm over the last dimension, written out in jnp."""
    if norm == "layernorm":
        h = h - jnp.mean(h, axis=-1, keepdims=True)
        return h / jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps) * scale + offset
    return h / jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps) * scale


def xla_collectives(hlo):
    return XLA_COLLECTIVE.findall(hlo)


def jaxcoll_calls(hlo):
    return sorted(set(re.findall(r'custom_call_target="(jaxcoll_\w+)"', hlo)))


@pytest.fixture(scope="module")
def row_parallel(mesh):
    """A row-parallel layer's operands (contraction sharded over "model"), its residual stream and norm vectors."""
    rng = np.random.default_rng(1)
    s = lambda *spec: NamedSharding(mesh, P(*spec))
    x = jax.device_put(rng.normal(size=(4, 16, 32)).astype(np.float32), s("data", None, "model"))
    w = jax.device_put(rng.normal(size=(32, 8)).astype(np.float32) / 5, s("model", None))
    r = jax.device_put(rng.normal(size=(4, 16, 8)).astype(np.float32), s("data", None, None))
    vec = lambda: jnp.asarray(rng.normal(size=8).astype(np.float32))
    return x, w, r, vec(), vec(), vec()


@pytest.mark.parametrize("norm,seq_parallel", [("rmsnorm", False), ("layernorm", False), ("rmsnorm", True)])
def test_dense_norm_equals_product_then_norm_with_gradients(mesh, row_parallel, norm, seq_parallel):
    x, w, r, scale, bias, offset = row_parallel
    offset = offset if norm == "layernorm" else None
    out = NamedSharding(mesh, P("data", "model" if seq_parallel else None, None))

    def ours(x, w, r, scale, bias):
        y, h = nn.dense_norm(x, w, scale, residual=r, bias=bias, offset=offset, norm=norm, return_residual=True)
        return jax.lax.with_sharding_constraint(y, out), h

    def reference(x, w, r, scale, bias):
        h = x @ w + bias + r
        return jax.lax.with_sharding_constraint(norm_reference(h, scale, offset, norm), out), h

    args = (x, w, r, scale, bias)
    for a, b in zip(jax.jit(ours)(*args), jax.jit(reference)(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # both outputs carry gradient: y through the norm, h as the next residual stream
    g = lambda f: jax.jit(jax.grad(lambda *a: jnp.sum(f(*a)[0] ** 3) + jnp.sum(jnp.sin(f(*a)[1])),
                                   argnums=tuple(range(5))))
    for a, b in zip(g(ours)(*args), g(reference)(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(b))))


def test_dense_norm_runs_the_fused_reduce_scatter_norm_all_gather_and_no_xla_collective(mesh, row_parallel):
    x, w, r, scale, bias, _ = row_parallel
    f = lambda x, w, r, scale, bias: nn.dense_norm(x, w, scale, residual=r, bias=bias)
    fwd = jax.jit(f).lower(x, w, r, scale, bias).compile().as_text()
    # the partial sums are reduce-scattered, normed on 1/4 of the rows and all-gathered: no all-reduce
    assert jaxcoll_calls(fwd) == ["jaxcoll_all_gather", "jaxcoll_reduce_scatter"]
    assert not xla_collectives(fwd)
    grad = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=tuple(range(5))))
    hlo = grad.lower(x, w, r, scale, bias).compile().as_text()
    assert "jaxcoll_all_reduce" in jaxcoll_calls(hlo)  # dw and the norm's vector gradients, summed over "data"
    assert not xla_collectives(hlo)


def test_dense_norm_whose_rows_do_not_split_over_the_group_all_reduces_then_norms(mesh):
    # 3 rows per device cannot be reduce-scattered over 4 ranks: matmul_all_reduce, then the norm of every row
    rng = np.random.default_rng(4)
    s = lambda *spec: NamedSharding(mesh, P(*spec))
    x = jax.device_put(rng.normal(size=(2, 3, 32)).astype(np.float32), s("data", None, "model"))
    w = jax.device_put(rng.normal(size=(32, 8)).astype(np.float32) / 5, s("model", None))
    scale = jnp.asarray(rng.normal(size=8).astype(np.float32))
    ours = jax.jit(lambda x, w, s: nn.dense_norm(x, w, s))
    np.testing.assert_allclose(ours(x, w, scale), norm_reference(x @ w, scale, None, "rmsnorm"), rtol=1e-5,
                               atol=1e-5)
    hlo = ours.lower(x, w, scale).compile().as_text()
    assert jaxcoll_calls(hlo) == ["jaxcoll_all_reduce"] and not xla_collectives(hlo)


def test_norm_on_sequence_sharded_rows_equals_reference_and_sums_vector_grads_on_jaxcoll(mesh):
    rng = np.random.default_rng(2)
    s = lambda *spec: NamedSharding(mesh, P(*spec))
    x = jax.device_put(rng.normal(size=(4, 16, 8)).astype(np.float32), s("data", "model", None))
    r = jax.device_put(rng.normal(size=(4, 16, 8)).astype(np.float32), s("data", "model", None))
    scale, bias, offset = (jnp.asarray(rng.normal(size=8).astype(np.float32)) for _ in range(3))
    ours = lambda x, r, s, b, o: nn.norm(x, s, residual=r, bias=b, offset=o, norm="layernorm")
    reference = lambda x, r, s, b, o: norm_reference(x + b + r, s, o, "layernorm")
    args = (x, r, scale, bias, offset)
    np.testing.assert_allclose(jax.jit(ours)(*args), jax.jit(reference)(*args), rtol=1e-5, atol=1e-5)
    g = lambda f: jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) ** 3), argnums=tuple(range(5))))
    for a, b in zip(g(ours)(*args), g(reference)(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(b))))
    fwd = jax.jit(ours).lower(*args).compile().as_text()
    assert not jaxcoll_calls(fwd) and not xla_collectives(fwd)  # row-wise: nothing to communicate
    hlo = g(ours).lower(*args).compile().as_text()
    assert jaxcoll_calls(hlo) == ["jaxcoll_all_reduce"] and not xla_collectives(hlo)


def test_norm_and_dense_norm_name_bad_operands(mesh):
    x = jnp.zeros((4, 8))
    with pytest.raises(ValueError, match=r"jaxcoll.nn.norm: norm='batchnorm'"):
        nn.norm(x, jnp.ones(8), norm="batchnorm")
    with pytest.raises(ValueError, match=r"jaxcoll.nn.norm: scale.shape=\(6,\) must be \(8,\)"):
        nn.norm(x, jnp.ones(6))
    with pytest.raises(ValueError, match=r"jaxcoll.nn.dense_norm: residual.shape=\(4, 8\) must be \(4, 3\)"):
        nn.dense_norm(x, jnp.zeros((8, 3)), jnp.ones(3), residual=x)


# -- jaxcoll.nn.adamw ---------------------------------------------------------------------------------------------

ADAM = dict(b1=0.9, b2=0.99, eps=1e-8, weight_decay=1e-2)


@pytest.fixture(scope="module")
def tp_params(mesh):
    """Column- and row-parallel weights and a replicated vector (7 elements: the flat state needs padding)."""
    rng = np.random.default_rng(3)
    s = lambda *spec: NamedSharding(mesh, P(*spec))
    return {"w1": jax.device_put(rng.normal(size=(8, 12)).astype(np.float32), s(None, "model")),
            "w2": jax.device_put(rng.normal(size=(12, 8)).astype(np.float32), s("model", None)),
            "scale": jax.device_put(rng.normal(size=(7,)).astype(np.float32), s(None))}


def test_adamw_steps_equal_optax_adamw_under_jit_with_shardings(mesh, tp_params):
    loss = lambda q: jnp.sum(jnp.tanh(q["w1"] @ q["w2"]) ** 2) + jnp.sum(q["scale"] ** 3)
    tx = optax.adamw(0.01, **ADAM)

    @jax.jit
    def ours(q, st):
        return nn.adamw(jax.grad(loss)(q), q, st, lr=0.01, **ADAM)

    @jax.jit
    def reference(q, st):
        u, st = tx.update(jax.grad(loss)(q), st, q)
        return optax.apply_updates(q, u), st

    q1, s1 = tp_params, nn.adamw_init(tp_params, mesh)
    q2, s2 = tp_params, tx.init(tp_params)
    for _ in range(4):
        q1, s1 = ours(q1, s1)
        q2, s2 = reference(q2, s2)
    for k in q1:
        np.testing.assert_allclose(q1[k], q2[k], rtol=1e-5, atol=1e-6)
        assert q1[k].sharding.is_equivalent_to(tp_params[k].sharding, q1[k].ndim)
    assert s1.mu.sharding.spec == P(("model", "data"))  # each device: 1/2 of its parameters' state


def test_adamw_partitions_onto_one_jaxcoll_all_gather_and_no_xla_collective(mesh, tp_params):
    state = nn.adamw_init(tp_params, mesh)
    step = jax.jit(lambda g, q, st: nn.adamw(g, q, st, lr=0.01))
    hlo = step.lower(tp_params, tp_params, state).compile().as_text()
    assert re.findall(r'custom_call_target="(jaxcoll_\w+)"', hlo) == ["jaxcoll_all_gather"]
    assert not xla_collectives(hlo)


def test_adamw_names_bad_arguments(mesh, tp_params):
    with pytest.raises(ValueError, match=r"axis_name='batch' is not an axis of the mesh \('data', 'model'\)"):
        nn.adamw_init(tp_params, mesh, axis_name="batch")
    with pytest.raises(TypeError, match=r"state must be a jaxcoll.fused.AdamState.*got tuple"):
        nn.adamw(tp_params, tp_params, (), lr=0.1)


# -- jaxcoll.nn.cross_entropy, jaxcoll.nn.embed -------------------------------------------------------------------


def test_cross_entropy_over_a_sharded_vocabulary_equals_optax_with_gradients_on_jaxcoll(mesh):
    rng = np.random.default_rng(5)
    s = lambda *spec: NamedSharding(mesh, P(*spec))
    logits = jax.device_put(3 * rng.normal(size=(4, 8, 32)).astype(np.float32), s("data", None, "model"))
    targets = jax.device_put(rng.integers(0, 32, (4, 8)).astype(np.int32), s("data", None))
    weights = jnp.asarray(rng.normal(size=(4, 8)).astype(np.float32))
    reference = optax.softmax_cross_entropy_with_integer_labels
    np.testing.assert_allclose(jax.jit(nn.cross_entropy)(logits, targets), jax.jit(reference)(logits, targets),
                               rtol=1e-6, atol=1e-6)
    g = lambda f: jax.jit(jax.grad(lambda l, t: jnp.sum(f(l, t) * weights)))
    np.testing.assert_allclose(g(nn.cross_entropy)(logits, targets), g(reference)(logits, targets), atol=1e-6)
    for f in (jax.jit(nn.cross_entropy), g(nn.cross_entropy)):
        hlo = f.lower(logits, targets).compile().as_text()
        # the rows' max over the vocabulary slices, then their sums of exponentials and target logits
        assert re.findall(r'custom_call_target="(jaxcoll_\w+)"', hlo) == ["jaxcoll_all_reduce"] * 2
        assert not xla_collectives(hlo)


def test_embed_equals_take_and_sums_the_table_gradient_on_jaxcoll(mesh):
    rng = np.random.default_rng(6)
    s = lambda *spec: NamedSharding(mesh, P(*spec))
    table = jax.device_put(rng.normal(size=(16, 8)).astype(np.float32), s(None, None))
    tokens = jax.device_put(rng.integers(0, 16, (4, 8)).astype(np.int32), s("data", "model"))
    weights = jnp.asarray(rng.normal(size=(4, 8, 8)).astype(np.float32))
    reference = lambda t, i: jnp.take(t, i, axis=0)
    np.testing.assert_array_equal(jax.jit(nn.embed)(table, tokens), reference(table, tokens))
    g = lambda f: jax.jit(jax.grad(lambda t, i: jnp.sum(jnp.sin(f(t, i)) * weights)))
    np.testing.assert_allclose(g(nn.embed)(table, tokens), g(reference)(table, tokens), atol=1e-6)
    fwd = jax.jit(nn.embed).lower(table, tokens).compile().as_text()
    assert not jaxcoll_calls(fwd) and not xla_collectives(fwd)
    hlo = g(nn.embed).lower(table, tokens).compile().as_text()
    assert jaxcoll_calls(hlo) == ["jaxcoll_all_reduce"] and not xla_collectives(hlo)


def test_cross_entropy_and_embed_name_bad_operands():
    with pytest.raises(ValueError, match=r"jaxcoll.nn.cross_entropy: targets.shape=\(3,\) must be"):
        nn.cross_entropy(jnp.zeros((4, 8)), jnp.zeros((3,), jnp.int32))
    with pytest.raises(TypeError, match=r"jaxcoll.nn.cross_entropy: targets must hold integer"):
        nn.cross_entropy(jnp.zeros((4, 8)), jnp.zeros((4,)))
    with pytest.raises(ValueError, match=r"jaxcoll.nn.embed: table must be \(V, D\), got table.shape=\(8,\)"):
        nn.embed(jnp.zeros(8), jnp.zeros(3, jnp.int32))
