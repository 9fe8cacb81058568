"""The programs test_tune_jobs.py runs in every process of a jax.distributed job (started by jaxcoll.launch):
`python tune_cases.py CASE`. A case raises when a check fails and prints `ok CASE <what it chose>` when every
check passed."""

from __future__ import annotations

import sys

import jaxcoll.launch

PROCESS, NPROCESSES = jaxcoll.launch.initialize()

import jax  # noqa: E402 - after the job is joined
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jaxcoll  # noqa: E402
from jaxcoll import tune  # noqa: E402


def case_same_choice() -> str:
    """Every process runs process 0's choice for auto, whatever tuning file each reads, and gets lax's sums."""
    mesh = Mesh(np.array(jax.devices()), ("i",))
    n = mesh.devices.size
    count = 1 << 18  # 1 MiB of float32 per rank
    g = np.arange(n * count, dtype=np.float32) % 5
    x = jax.make_array_from_callback(g.shape, NamedSharding(mesh, P("i")), lambda index: g[index])
    ours = jax.jit(jax.shard_map(lambda v: jaxcoll.all_reduce(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
    theirs = jax.jit(jax.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
    a, b = ours(x), theirs(x)
    for s, t in zip(a.addressable_shards, b.addressable_shards):
        np.testing.assert_array_equal(np.asarray(s.data), np.asarray(t.data))
    processes = tuple(d.process_index for d in jax.devices())
    hosts = jaxcoll.distributed.world().hosts
    from jaxcoll.lowering import groups
    layout = groups.host_layout(np.asarray(processes), hosts, n)
    name, _ = tune.choose("all_reduce", n, count * 4, "float32", processes, layout, agree=True)  # the lowering's
    return f"chose {name}"


if __name__ == "__main__":
    case = sys.argv[1]
    print("ok", case, globals()[f"case_{case}"](), flush=True)
    jax.distributed.shutdown()
