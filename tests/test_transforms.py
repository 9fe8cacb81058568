"""jaxcoll collectives compose with jax's transformations as their lax counterparts do: gradients (jax.grad,
jax.vjp) equal those of the lax versions, jax.vmap batches them, and they run inside lax.scan, fori_loop and
cond."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxcoll
from sharded import mesh, put, sharded

RING = [(0, 1), (1, 2), (2, 3), (3, 0)]

# (name, function of the collectives' namespace) giving a differentiable function of one rank's block, over axis "y" of 2x4
# or both axes; each mixes the collective with nonlinear local work so the cotangents are not uniform.
PAIRS = [
    ("all_reduce", lambda c: lambda t: jnp.sin(c.all_reduce(t * t, "y")) * t),
    ("all_reduce_both_axes", lambda c: lambda t: jnp.sin(c.all_reduce(t * t, ("x", "y"))) * t),
    ("all_gather", lambda c: lambda t: c.all_gather(jnp.sin(t), "y", axis=1, tiled=True) ** 2),
    ("all_gather_stacked", lambda c: lambda t: (c.all_gather(t * t, ("y", "x"), axis=0) ** 3).sum(0)),
    ("reduce_scatter", lambda c: lambda t: c.reduce_scatter(jnp.sin(t), "y", scatter_dimension=1, tiled=True) ** 2),
    ("all_to_all", lambda c: lambda t: c.all_to_all(jnp.sin(t), "y", 1, 0, tiled=True) ** 2),
    ("ppermute", lambda c: lambda t: c.ppermute(jnp.sin(t), "y", RING) * t),
]


class Lax:
    """The lax spellings of jaxcoll's collectives, so one function body serves both."""
    all_reduce = staticmethod(lax.psum)
    all_gather = staticmethod(lax.all_gather)
    ppermute = staticmethod(lax.ppermute)
    all_to_all = staticmethod(lax.all_to_all)

    @staticmethod
    def reduce_scatter(x, axis_name, *, scatter_dimension=0, tiled=False):
        return lax.psum_scatter(x, axis_name, scatter_dimension=scatter_dimension, tiled=tiled)

    @staticmethod
    def broadcast(x, axis_name, *, root=0):
        return lax.all_gather(x, axis_name)[root]


def x2x4(shape=(8, 8, 3), seed=0):
    return put(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), "2x4")


def loss(body):
    f = jax.shard_map(body, mesh=mesh("2x4"), in_specs=jax.P(("x", "y")), out_specs=jax.P(("x", "y")))
    return lambda v: (f(v) * jnp.arange(f(v).size, dtype=v.dtype).reshape(f(v).shape)).sum()


@pytest.mark.parametrize("name,make", [p[:2] for p in PAIRS], ids=[p[0] for p in PAIRS])
def test_grad_equals_the_grad_of_the_lax_version(name, make):
    x = x2x4()
    got = jax.jit(jax.grad(loss(make(jaxcoll))))(x)
    want = jax.jit(jax.grad(loss(make(Lax))))(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_grad_of_broadcast_sums_cotangents_into_the_root():
    x = x2x4()
    got = jax.jit(jax.grad(loss(lambda t: jnp.sin(jaxcoll.broadcast(t * t, "y", root=2)) * t)))(x)
    want = jax.jit(jax.grad(loss(lambda t: jnp.sin(Lax.broadcast(t * t, "y", root=2)) * t)))(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_vjp_of_all_gather_is_reduce_scatter_like_lax():
    x = x2x4()
    ct = x2x4((32, 8, 3), seed=1)

    def vjp(c):
        def body(t, u):
            _, pull = jax.vjp(lambda s: c.all_gather(s, "y", axis=0, tiled=True), t)
            return pull(u)[0]
        return jax.jit(jax.shard_map(body, mesh=mesh("2x4"), in_specs=jax.P(("x", "y")),
                                     out_specs=jax.P(("x", "y"))))
    np.testing.assert_allclose(vjp(jaxcoll)(x, ct), vjp(Lax)(x, ct), rtol=1e-5, atol=1e-5)


def test_max_and_min_are_not_differentiable_like_pmax():
    with pytest.raises(NotImplementedError, match="op='max'"):
        jax.grad(loss(lambda t: jaxcoll.all_reduce(t, "y", op="max")))(x2x4())


@pytest.mark.parametrize("in_axes", [0, 1])
def test_vmap_over_a_batch_dimension_inside_shard_map(in_axes):
    x = x2x4((8, 6, 8))

    def body(c):
        def per_example(t):
            return (c.all_reduce(t, "y"), c.all_gather(t, "y", axis=0), c.reduce_scatter(t, "y", tiled=True),
                    c.all_to_all(t, "y", 0, 0, tiled=True), c.ppermute(t, "y", RING), c.broadcast(t, "y", root=1))

        def f(v):
            outs = jax.vmap(per_example, in_axes=in_axes)(v[0] if in_axes == 0 else v[0].T)
            return tuple(o[None] for o in outs)
        return f
    spec = jax.P(("x", "y"))
    run = lambda c: jax.jit(jax.shard_map(body(c), mesh=mesh("2x4"), in_specs=spec, out_specs=spec))(x)
    for g, w in zip(run(jaxcoll), run(Lax)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("batch_axis", [0, 1, 2])
def test_vmap_places_the_batch_dimension_like_lax_around_the_communicated_dimension(batch_axis, dim, tiled):
    # Per example (4, 4) on axis "y" of size 4; the batch dimension lands before, between or after the scattered
    # / gathered dimension, where the batching rule must shift one or the other. The reference runs lax once per
    # example and stacks: jax 0.10.2's own batching of a non-tiled psum_scatter fails when the batch dimension
    # follows the scattered one (IndexError), so vmap of lax is no reference there.
    x = x2x4((8, 3 * 4 * 4))

    def per_example(c, t):
        return (c.reduce_scatter(t, "y", scatter_dimension=dim, tiled=tiled),
                c.all_gather(t, "y", axis=dim, tiled=tiled))

    def vmapped(v):
        batch = jnp.moveaxis(v[0].reshape(3, 4, 4), 0, batch_axis)
        outs = jax.vmap(partial(per_example, jaxcoll), in_axes=batch_axis)(batch)
        return tuple(o.reshape(1, -1) for o in outs)

    def looped(v):
        outs = zip(*(per_example(Lax, t) for t in v[0].reshape(3, 4, 4)))
        return tuple(jnp.stack(o).reshape(1, -1) for o in outs)
    spec = jax.P(("x", "y"))
    run = lambda f: jax.jit(jax.shard_map(f, mesh=mesh("2x4"), in_specs=spec, out_specs=spec))(x)
    for g, w in zip(run(vmapped), run(looped)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_vmap_over_a_named_axis_computes_locally_like_lax():
    x = jnp.asarray(np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32))
    f = lambda c: jax.vmap(lambda t: (c.all_reduce(t, "b"), c.all_gather(t, "b"), c.ppermute(t, "b", RING),
                                      c.reduce_scatter(t, "b", tiled=True), c.all_to_all(t, "b", 0, 0, tiled=True)),
                           axis_name="b")
    for g, w in zip(f(jaxcoll)(x), f(Lax)(x)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_inside_scan_fori_loop_and_cond():
    x = x2x4((8, 8))

    def body(c):
        def f(v):
            def step(carry, _):
                carry = c.all_reduce(carry, "y") / 4.0 + 0.5 * carry
                carry = c.ppermute(carry, "x", [(0, 1), (1, 0)]) + 1.0
                return carry, c.all_gather(carry, "y", axis=0, tiled=True).sum()
            v, sums = lax.scan(step, v, None, length=5)
            v = lax.fori_loop(0, 3, lambda i, t: c.reduce_scatter(c.all_gather(t, ("x", "y"), axis=1, tiled=True),
                                                                  ("x", "y"), scatter_dimension=1, tiled=True) / 8, v)
            pred = lax.psum(v.sum(), ("x", "y")) > 0  # the same on every rank
            v = lax.cond(pred, lambda t: c.all_reduce(t, "x"), lambda t: c.all_reduce(-t, "x"), v)
            return v, sums[None]
        return f
    spec = jax.P(("x", "y"))
    run = lambda c: jax.jit(jax.shard_map(body(c), mesh=mesh("2x4"), in_specs=spec, out_specs=spec))(x)
    for g, w in zip(run(jaxcoll), run(Lax)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
