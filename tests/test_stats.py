"""jaxcoll.stats(): per call site, the calls made, the bytes, the plan and the times, counted against the calls the
test makes; a reset forgets them; the table prints."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxcoll

MESH = jax.make_mesh((8,), ("i",))


def on_mesh(f):
    return jax.jit(jax.shard_map(f, mesh=MESH, in_specs=P("i"), out_specs=P("i")))


def sharded(x):
    return jax.device_put(x, NamedSharding(MESH, P("i")))


@pytest.fixture(autouse=True)
def forget_earlier_calls():
    jaxcoll.stats(reset=True)
    yield
    jaxcoll.stats(reset=True)


def sites_of(collective: str):
    return [s for s in jaxcoll.stats() if s.collective == collective]


def test_each_site_counts_its_calls_with_its_plan_and_bytes():
    psum = on_mesh(lambda x: jaxcoll.all_reduce(x, "i", algorithm="two_shot"))
    gather = on_mesh(lambda x: jaxcoll.all_gather(x, "i", tiled=True, algorithm="ring"))
    x = sharded(jnp.arange(8 * 1024, dtype=jnp.float32))
    for _ in range(5):
        jax.block_until_ready(psum(x))
    for _ in range(3):
        jax.block_until_ready(gather(x))
    [ar] = sites_of("all_reduce")
    [ag] = sites_of("all_gather")
    assert (ar.calls, ar.plan, ar.nranks, ar.bytes) == (5, "two_shot", 8, 1024 * 4)
    assert (ag.calls, ag.plan, ag.nranks, ag.bytes) == (3, "ring", 8, 1024 * 4)
    for s in (ar, ag):
        assert 0 < s.min_s <= s.median_s <= s.max_s


def test_a_reset_forgets_the_calls_after_reading_them():
    psum = on_mesh(lambda x: jaxcoll.all_reduce(x, "i"))
    x = sharded(jnp.ones(8 * 16, jnp.float32))
    jax.block_until_ready(psum(x))
    jax.block_until_ready(psum(x))
    [before] = [s for s in jaxcoll.stats(reset=True) if s.collective == "all_reduce"]
    assert before.calls == 2
    assert sites_of("all_reduce") == []
    jax.block_until_ready(psum(x))
    [after] = sites_of("all_reduce")
    assert after.calls == 1 and after.callsite == before.callsite


def test_a_site_in_a_scan_counts_every_iteration():
    def body(c, _):
        return jaxcoll.all_reduce(c, "i") / 8 + 0 * c, None  # + 0 * c: the carry stays varying over "i"

    loop = on_mesh(lambda x: jax.lax.scan(body, x, None, length=20)[0])
    out = loop(sharded(jnp.arange(8 * 4, dtype=jnp.float32)))
    np.testing.assert_allclose(np.asarray(out).reshape(8, 4)[0], np.arange(32, dtype=np.float32).reshape(8, 4).mean(0),
                               rtol=1e-5)
    [s] = sites_of("all_reduce")
    assert s.calls == 20


def test_the_table_names_every_site():
    psum = on_mesh(functools.partial(jaxcoll.all_reduce, axis_name="i", algorithm="ring"))
    jax.block_until_ready(psum(sharded(jnp.ones(8 * 256, jnp.float32))))
    text = str(jaxcoll.stats())
    assert "jaxcoll calls" in text and "all_reduce" in text and "ring" in text and "1 KiB" in text


def test_reset_must_be_a_bool():
    with pytest.raises(TypeError, match="stats: reset must be True or False, got 'yes'"):
        jaxcoll.stats(reset="yes")
