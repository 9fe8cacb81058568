"""jaxcoll.fused ops equal their unfused jax.lax compositions, in value and in gradient, for every chunk count."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcoll import fused
from jaxcoll.fused import comm

N = 4  # group size: small enough for 2 cores, large enough that a ring has interior steps
XLA_COLLECTIVE = r"\b(all-gather|reduce-scatter|all-reduce|collective-permute|all-to-all)(-start)?\("


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((N,), ("i",), axis_types=(AxisType.Auto,), devices=jax.devices()[:N])


def put(mesh, a, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def run(mesh, f, in_specs, out_specs):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def grads(mesh, f, in_specs, out_specs, *args):
    """Gradient of sum(out**2) over all ranks' outputs."""
    g = run(mesh, f, in_specs, out_specs)
    return jax.grad(lambda *a: jnp.sum(g(*a) ** 2), argnums=tuple(range(len(args))))(*args)


def close(a, b, tol=2e-5):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(u, np.float32), np.asarray(v, np.float32), rtol=tol, atol=tol)


rng = np.random.default_rng(0)


def normal(*shape, dtype=np.float32):
    return rng.normal(size=shape).astype(dtype)


@pytest.mark.parametrize("chunks", [1, N, 2 * N])
@pytest.mark.parametrize("gather_axis", [0, 1, -1])
def test_all_gather_matmul_equals_all_gather_then_dot(mesh, chunks, gather_axis):
    # x per rank (4, 6, 8): gathering dim 0 or 1 stacks rows; gathering the last dim contracts over the blocks.
    x_spec = [None, None, None]
    x_spec[gather_axis] = "i"
    x_spec = P(*x_spec)
    x = put(mesh, normal(4 * (N if gather_axis == 0 else 1), 6 * (N if gather_axis == 1 else 1),
                         8 * (N if gather_axis == -1 else 1)), x_spec)
    k = 8 * (N if gather_axis == -1 else 1)
    w = put(mesh, normal(k, 5 * N), P(None, "i"))
    out = P(None, None, "i")
    fused_f = lambda x, w: fused.all_gather_matmul(x, w, "i", gather_axis=gather_axis, chunks=chunks)
    ref_f = lambda x, w: lax.all_gather(x, "i", axis=gather_axis, tiled=True) @ w
    close(run(mesh, fused_f, (x_spec, P(None, "i")), out)(x, w), run(mesh, ref_f, (x_spec, P(None, "i")), out)(x, w))
    close(grads(mesh, fused_f, (x_spec, P(None, "i")), out, x, w),
          grads(mesh, ref_f, (x_spec, P(None, "i")), out, x, w), tol=1e-4)


@pytest.mark.parametrize("chunks", [1, N, 2 * N])
@pytest.mark.parametrize("scatter_axis", [0, 1, 2])
def test_matmul_reduce_scatter_equals_dot_then_psum_scatter(mesh, chunks, scatter_axis):
    shape = [2 * N, 2 * N, 3]  # x per rank (8, 8, 3 contraction); product (8, 8, 16)
    x = put(mesh, normal(*shape[:2], 3 * N), P(None, None, "i"))
    w = put(mesh, normal(3 * N, 4 * N), P("i"))
    out = [None, None, None]
    out[scatter_axis] = "i"
    out = P(*out)
    fused_f = lambda x, w: fused.matmul_reduce_scatter(x, w, "i", scatter_axis=scatter_axis, chunks=chunks)
    ref_f = lambda x, w: lax.psum_scatter(x @ w, "i", scatter_dimension=scatter_axis, tiled=True)
    specs = (P(None, None, "i"), P("i"))
    close(run(mesh, fused_f, specs, out)(x, w), run(mesh, ref_f, specs, out)(x, w))
    close(grads(mesh, fused_f, specs, out, x, w), grads(mesh, ref_f, specs, out, x, w), tol=1e-4)


def test_replicated_weight_gets_the_summed_gradient(mesh):
    # w invariant over "i": its cotangent is summed over ranks, as lax's transpose of the implicit broadcast does.
    x, w = put(mesh, normal(4 * N, 6), P("i")), put(mesh, normal(6, 5), P())
    fused_f = lambda x, w: lax.psum(jnp.sum(fused.all_gather_matmul(x, w, "i", chunks=N), 0), "i")
    ref_f = lambda x, w: lax.psum(jnp.sum(lax.all_gather(x, "i", tiled=True) @ w, 0), "i")
    close(grads(mesh, fused_f, (P("i"), P()), P(), x, w), grads(mesh, ref_f, (P("i"), P()), P(), x, w), tol=1e-4)


def test_bfloat16_collective_matmul_matches_reference(mesh):
    x = put(mesh, normal(8 * N, 16, dtype=jnp.bfloat16), P("i"))
    w = put(mesh, normal(16, 8 * N, dtype=jnp.bfloat16), P(None, "i"))
    f = run(mesh, lambda x, w: fused.all_gather_matmul(x, w, "i", chunks=N), (P("i"), P(None, "i")), P(None, "i"))
    ref = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
    close(f(x, w), ref, tol=5e-2)


@pytest.mark.parametrize("chunks", [1, 2])
def test_matmul_all_reduce_with_bias_and_residual(mesh, chunks):
    x, w = put(mesh, normal(8, 4 * N), P(None, "i")), put(mesh, normal(4 * N, 6), P("i"))
    bias, res = put(mesh, normal(6), P()), put(mesh, normal(8, 6), P())
    specs = (P(None, "i"), P("i"), P(), P())
    fused_f = lambda x, w, b, r: fused.matmul_all_reduce(x, w, "i", bias=b, residual=r, chunks=chunks)
    ref_f = lambda x, w, b, r: lax.psum(x @ w, "i") + b + r
    close(run(mesh, fused_f, specs, P())(x, w, bias, res), run(mesh, ref_f, specs, P())(x, w, bias, res))
    close(grads(mesh, fused_f, specs, P(), x, w, bias, res), grads(mesh, ref_f, specs, P(), x, w, bias, res),
          tol=1e-4)


def _ref_norm(h, scale, offset, norm, eps):
    if norm == "rmsnorm":
        return h / jnp.sqrt(jnp.mean(h * h, -1, keepdims=True) + eps) * scale
    mu = jnp.mean(h, -1, keepdims=True)
    return (h - mu) / jnp.sqrt(jnp.var(h, -1, keepdims=True) + eps) * scale + offset


@pytest.mark.parametrize("norm,chunks", [("rmsnorm", 1), ("layernorm", 2)])
def test_reduce_scatter_norm_all_gather_equals_psum_then_norm(mesh, norm, chunks):
    rows, hid = 4 * N, 16
    x = put(mesh, normal(N * rows, hid), P("i"))  # each rank: (rows, hid) partial sums
    res, bias, scale = put(mesh, normal(rows, hid), P()), put(mesh, normal(hid), P()), put(mesh, normal(hid), P())
    offset = put(mesh, normal(hid), P()) if norm == "layernorm" else None
    specs = (P("i"), P(), P(), P())

    def fused_f(x, r, b, s):
        y, h = fused.reduce_scatter_norm_all_gather(x, "i", residual=r, bias=b, scale=s, offset=offset, norm=norm,
                                                    eps=1e-5, return_residual=True, chunks=chunks)
        return jnp.concatenate([y, h], -1)

    def ref_f(x, r, b, s):
        h = lax.psum(x, "i") + b + r
        return jnp.concatenate([_ref_norm(h, s, offset, norm, 1e-5), h], -1)

    # out_specs P(): shard_map(check_vma=True) accepts it only for a result typed invariant over "i", as psum's is.
    close(run(mesh, fused_f, specs, P())(x, res, bias, scale), run(mesh, ref_f, specs, P())(x, res, bias, scale),
          tol=1e-4)
    close(grads(mesh, fused_f, specs, P(), x, res, bias, scale),
          grads(mesh, ref_f, specs, P(), x, res, bias, scale), tol=1e-3)


def test_norm_result_is_typed_invariant_like_psum(mesh):
    x, scale = put(mesh, normal(N * 4 * N, 8), P("i")), put(mesh, normal(8), P())

    def types(f):
        seen = []

        def body(x, s):
            y = f(x, s)
            seen.append(comm.vma(y))
            return y

        jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P()), out_specs=P())).lower(x, scale)
        return seen[0]

    ours = types(lambda x, s: fused.reduce_scatter_norm_all_gather(x, "i", scale=s))
    assert ours == types(lambda x, s: lax.psum(x, "i") * s) == frozenset()


def test_invariant_all_gather_equals_lax_all_gather_invarying(mesh):
    # comm.all_gather_invariant is the gather the norm and adam ops end with: one all-gather's data movement,
    # the result typed invariant, and a transpose that slices the cotangent instead of reduce-scattering it.
    x = put(mesh, normal(4 * N, 3, 5), P("i"))
    for axis in (0, 1):
        ours = lambda x: comm.all_gather_invariant(x, "i", axis) * 2.0
        ref = lambda x: lax.all_gather(x, "i", axis=axis, tiled=True, to="invarying") * 2.0
        close(run(mesh, ours, (P("i"),), P())(x), run(mesh, ref, (P("i"),), P())(x))
        close(grads(mesh, ours, (P("i"),), P(), x), grads(mesh, ref, (P("i"),), P(), x))
        hlo = run(mesh, ours, (P("i"),), P()).lower(x).compile().as_text()
        assert hlo.count('custom_call_target="jaxcoll_all_gather"') == 1
        assert not re.search(XLA_COLLECTIVE, hlo)
    # vmap over a batch dimension inside shard_map (dimension 1 of x batched, gather along the rows).
    ours = jax.vmap(lambda v: comm.all_gather_invariant(v, "i", 0), in_axes=1, out_axes=1)
    ref = jax.vmap(lambda v: lax.all_gather(v, "i", axis=0, tiled=True, to="invarying"), in_axes=1, out_axes=1)
    close(run(mesh, ours, (P("i"),), P())(x), run(mesh, ref, (P("i"),), P())(x))


def test_reduce_scatter_adam_all_gather_matches_optax_adamw(mesh):
    params = {"w": normal(5, 7), "b": normal(3), "s": normal(2, 2, 2)}
    per_rank_grads = [jax.tree.map(lambda a: normal(*a.shape), params) for _ in range(N)]
    stacked = jax.tree.map(lambda *g: put(mesh, np.concatenate(g), P("i")), *per_rank_grads)
    hyper = dict(lr=1e-2, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1)
    state = fused.adam_init_global(params, N)
    sspec = fused.AdamState(P(), P("i"), P("i"), P("i"))
    state = jax.tree.map(lambda a, s: put(mesh, a, s), state, sspec)
    step = run(mesh, lambda g, q, s: fused.reduce_scatter_adam_all_gather(g, q, s, "i", **hyper),
               (P("i"), P(), sspec), (P(), sspec))

    tx = optax.adamw(hyper["lr"], b1=hyper["b1"], b2=hyper["b2"], eps=hyper["eps"], weight_decay=hyper["weight_decay"])
    ref_params, ref_state = params, tx.init(params)
    ours = jax.tree.map(lambda a: put(mesh, a, P()), params)
    for it in range(3):
        scale = 1.0 + it
        g_ranks = jax.tree.map(lambda a: a * scale, stacked)
        ours, state = step(g_ranks, ours, state)
        total = jax.tree.map(lambda *g: sum(g) * scale, *per_rank_grads)
        upd, ref_state = tx.update(total, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, upd)
        close(ours, ref_params, tol=1e-5)


def test_errors_name_the_shapes(mesh):
    x, w = put(mesh, normal(4 * N, 6), P("i")), put(mesh, normal(7, 5), P())
    with pytest.raises(ValueError, match=r"x.shape=\(4, 6\).*w.shape=\(7, 5\)"):
        run(mesh, lambda x, w: fused.all_gather_matmul(x, w, "i"), (P("i"), P()), P())(x, w)
    x2 = put(mesh, normal(6, 4 * N), P(None, "i"))
    w2 = put(mesh, normal(4 * N, 5), P("i"))
    with pytest.raises(ValueError, match=r"\(6, 5\).*not divisible by the group size 4"):
        run(mesh, lambda x, w: fused.matmul_reduce_scatter(x, w, "i"), (P(None, "i"), P("i")), P("i"))(x2, w2)
    with pytest.raises(TypeError, match="x.dtype=float32 and w.dtype=bfloat16"):
        run(mesh, lambda x, w: fused.all_gather_matmul(x, w.astype(jnp.bfloat16), "i"), (P("i"), P()), P())(
            x, put(mesh, normal(6, 5), P()))
    with pytest.raises(ValueError, match="multiple of the group size"):
        run(mesh, lambda x, w: fused.all_gather_matmul(x, w, "i", chunks=3), (P("i"), P()), P())(
            x, put(mesh, normal(6, 5), P()))


def jaxcoll_calls(hlo: str) -> dict:
    """Count of each jaxcoll custom-call target in a compiled program."""
    out = {}
    for target in re.findall(r'custom_call_target="(jaxcoll_\w+)"', hlo):
        out[target] = out.get(target, 0) + 1
    return out


@pytest.mark.parametrize("chunks", [1, N])
def test_fused_ops_compile_to_jaxcoll_custom_calls_not_xla_collectives(mesh, chunks):
    x, w = put(mesh, normal(4 * N, 8), P("i")), put(mesh, normal(8, 4 * N), P(None, "i"))
    scale, res = put(mesh, normal(8), P()), put(mesh, normal(4 * N, 8), P())

    def step(x, w, s, r):
        y = fused.all_gather_matmul(x, w, "i", chunks=chunks)                 # (4N, 4) per rank
        z = fused.matmul_reduce_scatter(y, w.T, "i", chunks=chunks)           # (4, 8)
        u = fused.matmul_all_reduce(z, w, "i", chunks=1 if chunks == 1 else 2)   # (4, 4), invariant
        v = fused.reduce_scatter_norm_all_gather(y @ w.T, "i", scale=s, bias=s, residual=r,
                                                 chunks=1 if chunks == 1 else 2)   # (4N, 8), invariant
        return u, v

    f = run(mesh, step, (P("i"), P(None, "i"), P(), P()), (P(), P()))
    train = jax.jit(jax.grad(lambda *a: sum(jnp.sum(o ** 2) for o in f(*a)), argnums=(0, 1, 2, 3)))
    for g in (f, train):
        hlo = g.lower(x, w, scale, res).compile().as_text()
        assert jaxcoll_calls(hlo)
        assert not re.search(XLA_COLLECTIVE, hlo), re.search(XLA_COLLECTIVE, hlo)


def test_adam_moves_one_reduce_scatter_and_one_all_gather_of_the_shard(mesh):
    # The minimum: the gradient is reduce-scattered (each rank sends (p-1)/p of it) and each rank's updated
    # shard is all-gathered once; no all-reduce, no second gather, no XLA collective.
    params = {"w": put(mesh, normal(6, 10), P()), "b": put(mesh, normal(10), P())}
    g = jax.tree.map(lambda a: put(mesh, normal(N * a.shape[0], *a.shape[1:]), P("i")), params)
    sspec = fused.AdamState(P(), P("i"), P("i"), P("i"))
    state = jax.tree.map(lambda a, s: put(mesh, a, s), fused.adam_init_global(params, N), sspec)
    step = run(mesh, lambda g, q, s: fused.reduce_scatter_adam_all_gather(g, q, s, "i", lr=1e-2),
               (P("i"), P(), sspec), (P(), sspec))
    hlo = step.lower(g, params, state).compile().as_text()
    assert jaxcoll_calls(hlo) == {"jaxcoll_reduce_scatter": 1, "jaxcoll_all_gather": 1}
    shard = fused.shard_size(params, N)
    gather = next(ln for ln in hlo.splitlines() if 'custom_call_target="jaxcoll_all_gather"' in ln)
    assert re.search(rf"= f32\[{N},{shard}\]", gather), gather   # N blocks of one shard: the gathered params
    assert not re.search(XLA_COLLECTIVE, hlo)


def _program(f, mesh, in_specs, out_specs, *args) -> str:
    """The compiled program's instructions, without names, call-site ids and source locations."""
    hlo = run(mesh, f, in_specs, out_specs).lower(*args).compile().as_text().split("FileNames")[0]
    for pattern, repl in ((r"callsite = \d+", "callsite"), (r"metadata=\{[^}]*\}", ""), (r"HloModule \S+", ""),
                          (r"%[\w.-]+", "%v")):
        hlo = re.sub(pattern, repl, hlo)
    return hlo


def test_chosen_chunks_on_cpu_compile_to_the_unfused_jaxcoll_program(mesh):
    # On CPU devices the ring cannot overlap (docs/benchmarks-fused.md), so chunks=None must cost nothing over
    # the unfused composition: the compiled programs are the same, one jaxcoll collective and one product.
    if jax.default_backend() != "cpu":
        pytest.skip("the chunks=None expectation here is XLA:CPU's")
    import jaxcoll
    m, k = 64 * N, 64  # rank blocks of 16 KiB to 256 KiB
    xr, wc = put(mesh, normal(m, k), P("i")), put(mesh, normal(k, k * N), P(None, "i"))
    xc, wr = put(mesh, normal(m, k * N), P(None, "i")), put(mesh, normal(k * N, k), P("i"))
    pairs = [
        (lambda x, w: fused.all_gather_matmul(x, w, "i"), lambda x, w: jaxcoll.all_gather(x, "i", tiled=True) @ w,
         (P("i"), P(None, "i")), P(None, "i"), (xr, wc)),
        (lambda x, w: fused.matmul_reduce_scatter(x, w, "i"),
         lambda x, w: jaxcoll.reduce_scatter(x @ w, "i", scatter_dimension=0, tiled=True),
         (P(None, "i"), P("i")), P("i"), (xc, wr)),
        (lambda x, w: fused.matmul_all_reduce(x, w, "i"), lambda x, w: jaxcoll.all_reduce(x @ w, "i"),
         (P(None, "i"), P("i")), P(), (xc, wr)),
    ]
    for ours, unfused, in_specs, out_specs, args in pairs:
        assert _program(ours, mesh, in_specs, out_specs, *args) == _program(unfused, mesh, in_specs, out_specs, *args)


def test_forced_ring_runs_a_ring_of_ppermutes(mesh):
    # chunks=2N: (N-1) hops of 2 pieces each, and no all-gather; the values are still the product's.
    x, w = put(mesh, normal(8 * N, 16), P("i")), put(mesh, normal(16, 8 * N), P(None, "i"))
    f = run(mesh, lambda x, w: fused.all_gather_matmul(x, w, "i", chunks=2 * N), (P("i"), P(None, "i")),
            P(None, "i"))
    assert jaxcoll_calls(f.lower(x, w).compile().as_text()) == {"jaxcoll_ppermute": 2 * (N - 1)}
    close(f(x, w), np.asarray(x) @ np.asarray(w), tol=1e-4)


def test_chunk_choice_by_platform_and_size(monkeypatch):
    from jaxcoll.fused import chunks as chunking
    big, small = chunking.OVERLAP_MIN_BLOCK_BYTES, chunking.OVERLAP_MIN_BLOCK_BYTES - 1
    monkeypatch.setattr(chunking, "platform", lambda: "cpu")
    assert chunking.choose("op", None, 8, 64 * big, 16, "d") == 1
    assert chunking.choose("op", 16, 8, 64 * big, 16, "d") == 16
    monkeypatch.setattr(chunking, "platform", lambda: "gpu")
    assert chunking.choose("op", None, 8, big, 16, "d") == 8
    assert chunking.choose("op", None, 8, small, 16, "d") == 1
    assert chunking.choose_pieces("op", None, 8, big, 24, "d") == 8
    assert chunking.choose_pieces("op", None, 8, big, 12, "d") == 1   # rows not divisible by p: no split
