"""XLA does not order custom calls: collectives that do not depend on each other may run in different orders
on different devices. These programs would deadlock or mix data if the runtime paired the wrong calls."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxcoll
from sharded import mesh, per_rank, put, sharded, small_ints

SPEC = jax.P(("x", "y"))


def ints(shape, seed=0):
    return put(small_ints(np.random.default_rng(seed), shape, np.int32), "2x4")


def run(fn, *args):
    return sharded(per_rank(fn), "2x4")(*args)


def assert_same(got, want):
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(np.asarray(g), np.asarray(w)), got, want)


def test_independent_collectives_in_one_program_keep_their_data():
    x, z = ints((8, 16)), ints((8, 16), seed=1)

    def body(c):
        # Same shapes and dtypes, no data dependence between them: only the call site tells them apart.
        return lambda u, v: (c["ar"](u, "y"), c["ar"](v, "y"), c["ag"](u, "y"), c["ag"](v * 2, "y"))
    ours = {"ar": jaxcoll.all_reduce, "ag": jaxcoll.all_gather}
    theirs = {"ar": lax.psum, "ag": lax.all_gather}
    assert_same(run(body(ours), x, z), run(body(theirs), x, z))


def test_collectives_over_both_axes_of_a_2d_mesh_interleaved():
    x = ints((8, 8, 8))

    def body(ar, ag, rs):
        def f(v):
            a, b = ar(v, "x"), ar(v, "y")  # groups of 2 and groups of 4, running at once
            c, d = ag(v, "y", axis=1, tiled=True), ag(v, "x", axis=0, tiled=True)
            e = rs(a + b, ("x", "y"), scatter_dimension=0, tiled=True)
            return a, b, c, d, ar(e, "x"), ag(ar(v, ("y", "x")), "x")
        return f
    rs_lax = lambda v, a, scatter_dimension, tiled: lax.psum_scatter(v, a, scatter_dimension=scatter_dimension,
                                                                      tiled=tiled)
    assert_same(run(body(jaxcoll.all_reduce, jaxcoll.all_gather, jaxcoll.reduce_scatter), x),
                run(body(lax.psum, lax.all_gather, rs_lax), x))


def test_200_scan_iterations_with_several_collectives_each():
    x = ints((8, 8))

    def body(ar, pp, ag):
        def f(v):
            def step(carry, i):
                s = ar(carry, "y")
                t = pp(carry, "x", [(0, 1), (1, 0)])
                g = ag(carry + i, ("x", "y"), axis=0, tiled=True)
                carry = (s + t + g[:carry.shape[0]]) % 1000 - 500
                return carry, ar(carry, ("x", "y")).sum()
            return lax.scan(step, v, jnp.arange(200, dtype=v.dtype))
        return f
    assert_same(run(body(jaxcoll.all_reduce, jaxcoll.ppermute, jaxcoll.all_gather), x),
                run(body(lax.psum, lax.ppermute, lax.all_gather), x))


def test_one_compiled_program_called_1000_times_gives_each_call_its_own_result():
    x = ints((8, 4))
    f = sharded(per_rank(lambda v, i: (jaxcoll.all_reduce(v + i, "y"), jaxcoll.all_gather(v * i, "x"))), "2x4")
    g = sharded(per_rank(lambda v, i: (lax.psum(v + i, "y"), lax.all_gather(v * i, "x"))), "2x4")
    steps = [put(np.full((8,), i, np.int32), "2x4") for i in range(1000)]
    # Launches overlap (several in flight, XLA:CPU pairs them by run id), but not without bound: XLA:CPU's own
    # dispatch stalls past ~200 unwaited multi-device launches on 2 cores, lax.psum's included (docs/runtime.md).
    got = []
    for k in range(0, len(steps), 10):
        got += [f(x, i) for i in steps[k:k + 10]]
        jax.block_until_ready(got[-1])
    for i in (0, 1, 2, 499, 998, 999):
        assert_same(got[i], g(x, steps[i]))
    first = np.asarray(got[0][0])
    for i, (a, _) in enumerate(got):  # psum(v + i) = psum(v) + 4 i
        np.testing.assert_array_equal(np.asarray(a), first + 4 * i)


def test_many_independent_collectives_with_large_buffers_do_not_starve_xla_thread_pool():
    # With large buffers XLA:CPU runs independent thunks concurrently and offloads some to its intra-op pool; a
    # collective that held a pool thread while waiting for peers could wait on a peer queued behind it. Ranks
    # that arrive early return pending instead, so any number of independent collectives complete.
    x = put(np.random.default_rng(5).standard_normal((8, 12, 64 * 1024)).astype(np.float32), "2x4")

    def body(ar):
        def f(v):
            parts = [jnp.sin(v[k] * (k + 1)) for k in range(v.shape[0])]
            return jnp.stack([jnp.cos(ar(p, ("x", "y"))) for p in parts])
        return f
    want = run(body(lax.psum), x)
    ours = sharded(per_rank(body(jaxcoll.all_reduce)), "2x4")
    for _ in range(10):
        np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(want), rtol=1e-5, atol=1e-5)
