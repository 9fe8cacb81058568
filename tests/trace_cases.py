"""The program test_trace.py runs in each process of a 2-process jax.distributed job (jaxcoll.launch):
`python trace_cases.py PATH`. It traces three all_reduce calls (ring, 4 ranks, 2 a process) to PATH, checks
their result against numpy, and prints `stats calls N` (jaxcoll.stats()'s count of the site's calls)."""

from __future__ import annotations

import sys

import jaxcoll.launch

PROCESS, NPROCESSES = jaxcoll.launch.initialize()

import jax  # noqa: E402 - after the job is joined
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jaxcoll  # noqa: E402
from jaxcoll import algorithms  # noqa: E402

mesh = Mesh(np.array(jax.devices()), ("i",))
plan = algorithms.select("all_reduce", 4, 1024, np.float32, "ring")
f = jax.jit(jax.shard_map(lambda x: jaxcoll.all_reduce(x, "i", algorithm=plan), mesh=mesh, in_specs=P("i"),
                          out_specs=P("i")))
x_global = np.arange(4 * 64, dtype=np.float32)
x = jax.make_array_from_callback(x_global.shape, NamedSharding(mesh, P("i")), lambda index: x_global[index])
jax.block_until_ready(f(x))
with jaxcoll.trace(sys.argv[1]):
    for _ in range(3):
        y = jax.block_until_ready(f(x))
want = x_global.reshape(4, -1).sum(0)
for shard in y.addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), want)
[site] = [s for s in jaxcoll.stats() if s.collective == "all_reduce"]
print(f"stats calls {site.calls}", flush=True)
