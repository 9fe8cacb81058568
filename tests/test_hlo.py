"""A program using jaxcoll compiles to jaxcoll's FFI custom calls and to none of XLA's collectives."""

import os
import re
import subprocess
import sys

import jax
import numpy as np

import jaxcoll
from sharded import mesh, put, sharded

XLA_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                   "collective-broadcast")


def compiled_hlo(fn, x, mesh_name="2x4"):
    return sharded(fn, mesh_name).lower(x).compile().as_text()


def test_compiled_program_has_jaxcoll_custom_calls_and_no_xla_collectives():
    x = put(np.zeros((8, 8, 4), np.float32), "2x4")

    def f(v):
        a = jaxcoll.all_reduce(v, "y")
        b = jaxcoll.all_gather(a, "x", axis=1, tiled=True)
        c = jaxcoll.reduce_scatter(b, ("x", "y"), scatter_dimension=1, tiled=True)
        d = jaxcoll.all_to_all(v, "y", 1, 2, tiled=True)
        e = jaxcoll.ppermute(v, "x", [(0, 1), (1, 0)])
        g = jaxcoll.broadcast(v, ("y", "x"), root=3)
        return (a + e + g).sum() + c.sum() + d.sum() + v * 0
    text = compiled_hlo(f, x)
    targets = set(re.findall(r'custom_call_target="(jaxcoll_\w+)"', text))
    assert targets == {"jaxcoll_all_reduce", "jaxcoll_all_gather", "jaxcoll_reduce_scatter", "jaxcoll_all_to_all",
                       "jaxcoll_ppermute", "jaxcoll_broadcast"}
    for op in XLA_COLLECTIVES:
        assert not re.search(rf"\b{op}(-start|-done)?\(", text), f"compiled HLO contains XLA's {op}"


def test_gradients_and_loops_lower_to_jaxcoll_too():
    x = put(np.zeros((8, 8), np.float32), "2x4")

    def f(v):
        def loss(t):
            t, _ = jax.lax.scan(lambda c, _: (jaxcoll.all_gather(c, "y", axis=0, tiled=True)[:c.shape[0]] * c, None),
                                t, None, length=3)
            return jaxcoll.all_reduce(t * t, ("x", "y")).sum()
        return jax.grad(loss)(v)
    text = compiled_hlo(f, x)
    assert "jaxcoll_reduce_scatter" in text  # all_gather's transpose
    for op in XLA_COLLECTIVES:
        assert not re.search(rf"\b{op}(-start|-done)?\(", text), f"compiled HLO contains XLA's {op}"


def test_each_call_site_gets_its_own_callsite_attribute():
    x = put(np.zeros((8, 4), np.float32), "2x4")
    text = sharded(lambda v: jaxcoll.all_reduce(v, "y") + jaxcoll.all_reduce(v, "y"), "2x4").lower(x).as_text()
    sites = re.findall(r"callsite = (\d+) : i64", text)
    assert len(sites) == 2 and len(set(sites)) == 2


def test_tracing_a_collective_registers_the_targets_before_lowering():
    # A fresh process: `import jaxcoll` loads no native module; tracing a collective (its first use) registers the
    # FFI targets, so XLA knows them before the program compiles, and the lowering rule has nothing to set up.
    code = """if True:
        import os, sys
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import jax, numpy as np
        from jax.sharding import PartitionSpec as P
        import jaxcoll
        assert "jaxcoll.runtime" not in sys.modules, "import jaxcoll loaded the runtime"
        mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
        f = jax.jit(jax.shard_map(lambda v: jaxcoll.all_reduce(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()))
        x = jax.device_put(np.arange(4, dtype=np.float32), jax.NamedSharding(mesh, P("x")))
        traced = f.trace(x)
        assert "jaxcoll.runtime" in sys.modules, "tracing the collective did not register the targets"
        assert "jaxcoll_all_reduce" in traced.lower().as_text()
        print(np.asarray(f(x)).tolist())
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith(str(np.arange(4.0).reshape(2, 2).sum(0).tolist())), out.stdout  # numpy's sum
