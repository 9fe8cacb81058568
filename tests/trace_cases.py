"""The program test_trace.py runs in each process of a 2-process jax.distributed job (jaxcoll.launch):
`python trace_cases.py PATH COLLECTIVE ALGORITHM`. It traces three calls of the collective over 4 ranks (2 a
process) to PATH, with the plan `jaxcoll.algorithms.select` gives for those processes, checks their results
against XLA's own collective (gloo) in the same program, and prints `stats calls N` (jaxcoll.stats()'s count of
the site's calls)."""

from __future__ import annotations

import sys

import jaxcoll.launch

PROCESS, NPROCESSES = jaxcoll.launch.initialize()

import jax  # noqa: E402 - after the job is joined
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jaxcoll  # noqa: E402
from jaxcoll import algorithms  # noqa: E402

path, collective, name = sys.argv[1:4]
mesh = Mesh(np.array(jax.devices()), ("i",))
plan = algorithms.select(collective, 4, 1024, np.float32, name, processes=(0, 0, 1, 1))
if collective == "all_reduce":
    ours, xla = (lambda x: jaxcoll.all_reduce(x, "i", algorithm=plan)), (lambda x: lax.psum(x, "i"))
else:
    ours = lambda x: jaxcoll.all_to_all(x, "i", 0, 0, tiled=True, algorithm=plan)  # noqa: E731
    xla = lambda x: lax.all_to_all(x, "i", 0, 0, tiled=True)  # noqa: E731
f = jax.jit(jax.shard_map(lambda x: (ours(x), xla(x)), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
x_global = np.arange(4 * 64, dtype=np.float32)
x = jax.make_array_from_callback(x_global.shape, NamedSharding(mesh, P("i")), lambda index: x_global[index])
jax.block_until_ready(f(x))
with jaxcoll.trace(path):
    for _ in range(3):
        y, want = jax.block_until_ready(f(x))
for a, b in zip(y.addressable_shards, want.addressable_shards):
    np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
[site] = [s for s in jaxcoll.stats() if s.collective == collective]
print(f"stats calls {site.calls}", flush=True)
