"""jaxcoll.optax.compressed_sync inside a shard_map'd step: the exact sync is lax.pmean, error feedback keeps
exactly what the compression lost, and the convergence example (short) trains like the exact run."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import compress_reference as ref
import jaxcoll.optax
from jaxcoll.compress import Int8, TopK
from sharded import mesh, put

GRADS = {"w": (3, 40), "b": (7,)}  # 127 elements: no leaf a multiple of a block


def grads(seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal((8, *s)).astype(np.float32) for k, s in GRADS.items()}


def run_steps(compression, g, steps, error_feedback=True):
    """The synced updates of `steps` updates of the same per-rank gradients g, and the final residuals."""
    tx = jaxcoll.optax.compressed_sync("i", compression, error_feedback=error_feedback)

    def body(g):
        g = jax.tree.map(lambda a: a[0], g)
        state = tx.init(g)
        outs = []
        for _ in range(steps):
            u, state = tx.update(g, state)
            outs.append(u)
        res = state.residual if state.residual is not None else jax.tree.map(jnp.zeros_like, g)
        return jax.tree.map(lambda *a: jnp.stack(a), *outs), jax.tree.map(lambda r: r, res)

    specs = {k: P("i") for k in GRADS}
    f = jax.jit(jax.shard_map(body, mesh=mesh("1d8"), in_specs=(specs,), out_specs=(P(), specs)))
    updates, residual = f({k: put(v, "1d8") for k, v in g.items()})
    return jax.tree.map(np.asarray, updates), jax.tree.map(np.asarray, residual)


def test_without_compression_it_is_pmean():
    g = grads()
    updates, _ = run_steps(None, g, 1)
    f = jax.jit(jax.shard_map(lambda a: lax.pmean(a[0], "i"), mesh=mesh("1d8"), in_specs=P("i"), out_specs=P()))
    for k in GRADS:
        np.testing.assert_allclose(updates[k][0], np.asarray(f(put(g[k], "1d8"))), rtol=1e-6, atol=1e-7)


def test_int8_residual_is_what_the_first_encoding_lost():
    g = grads()
    updates, residual = run_steps(Int8(32), g, 1)
    # The bucket: the leaves flattened in tree order (b, w), zero-padded to whole blocks.
    for r in range(8):
        flat = np.concatenate([g["b"][r].ravel(), g["w"][r].ravel()])
        flat = np.pad(flat, (0, -flat.size % 32))
        lost = (flat - ref.roundtrip(flat, "int8", 32))[:127]
        got = np.concatenate([residual["b"][r].ravel(), residual["w"][r].ravel()])
        np.testing.assert_allclose(got, lost, rtol=1e-5, atol=1e-6)
    mean = {k: g[k].mean(0) for k in GRADS}
    for k in GRADS:
        assert np.max(np.abs(updates[k][0] - mean[k])) < 0.02 * np.max(np.abs(g[k]))


def test_topk_error_feedback_applies_every_gradient_entry_in_full():
    # Sparse sums are exact on what they send, so over T steps of the same gradients:
    #   N * sum_t update_t + sum_r residual_r == T * sum_r g_r
    g = grads(1)
    steps = 12
    updates, residual = run_steps(TopK(k=8), g, steps)
    for k in GRADS:
        lhs = 8 * updates[k].sum(0) + residual[k].reshape(8, *GRADS[k]).sum(0)
        np.testing.assert_allclose(lhs, steps * g[k].sum(0), rtol=1e-4, atol=1e-4)
        assert np.count_nonzero(updates[k][0]) < g[k][0].size  # sparse: not everything went in one step


def test_unknown_compression_fails_at_construction():
    with pytest.raises(ValueError, match="compression='zstd'"):
        jaxcoll.optax.compressed_sync("i", "zstd")


def test_example_trains_like_the_exact_run_in_a_short_run():
    sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
    import compressed_training as example
    results = example.run(60)
    exact = example.final(results["exact"])
    assert exact < 0.5 * results["exact"][0]  # it learns
    for name, losses in results.items():
        assert np.all(np.isfinite(losses)), name
        tolerance = example.TOLERANCE if name != "top-k 1%" else 0.5  # top-k catches up later (docs)
        assert abs(example.final(losses) / exact - 1) <= tolerance, (name, example.final(losses), exact)


def test_without_optax_the_import_says_which_extra_to_install():
    code = ("import sys; sys.modules['optax'] = None\n"  # a None entry makes `import optax` fail as if absent
            "try:\n    import jaxcoll.optax\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert "pip install 'jaxcoll[optax]'" in out.stdout, out.stdout + out.stderr
