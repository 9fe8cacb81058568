"""Meshes and runners shared by the collective tests: each program runs once under jax.jit(jax.shard_map),
with the input sharded over every mesh axis, so rank r of the mesh holds row block r of the global input."""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

# name -> (mesh shape, axis names)
MESHES = {"1d2": ((2,), ("i",)), "1d4": ((4,), ("i",)), "1d8": ((8,), ("i",)), "2x4": ((2, 4), ("x", "y"))}
# (mesh, axis_name) pairs the tests cover: every 1D mesh, and either axis or the tuple (both orders) of 2x4.
MESH_AXES = [("1d2", "i"), ("1d4", "i"), ("1d8", "i"), ("2x4", "x"), ("2x4", "y"), ("2x4", ("x", "y")),
             ("2x4", ("y", "x"))]


@functools.cache
def mesh(name: str) -> jax.sharding.Mesh:
    shape, names = MESHES[name]
    return jax.make_mesh(shape, names, devices=jax.devices()[:int(np.prod(shape))])


def group_size(name: str, axis_name) -> int:
    m = mesh(name)
    axes = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    return int(np.prod([m.shape[a] for a in axes]))


def all_axes(name: str):
    return tuple(mesh(name).axis_names)


def sharded(fn, mesh_name: str, *, check_vma: bool = True):
    """jit(shard_map(fn)) with every input and output sharded over all mesh axes along its leading dim."""
    spec = P(all_axes(mesh_name))
    return jax.jit(jax.shard_map(fn, mesh=mesh(mesh_name), in_specs=spec, out_specs=spec, check_vma=check_vma))


def put(x, mesh_name: str):
    return jax.device_put(x, NamedSharding(mesh(mesh_name), P(all_axes(mesh_name))))


def per_rank(fn):
    """Wrap fn so each rank returns its result with a leading unit dimension: the global output then holds
    every rank's result along axis 0, which is how tests see all ranks' results."""
    return lambda *a: jax.tree.map(lambda y: y[None], fn(*jax.tree.map(lambda v: v[0], a)))


def small_ints(rng, shape, dtype):
    """Random integer values that every supported dtype holds exactly, and whose sums over 8 ranks are exact
    in every dtype (|sum| <= 32): results can then be compared bitwise with lax, sums included."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    lo = 0 if dtype.kind == "u" else -4
    return rng.integers(lo, 5, shape).astype(dtype)


def memory_after_release(expected_bytes: int, timeout_s: float = 10.0) -> tuple[int, int]:
    """jaxcoll.runtime.communicator_memory() once its bytes come to `expected_bytes`, or as it is after `timeout_s`.
    A dropped executable goes when XLA's last reference to it does, which an execution whose outputs are already
    ready may hold a moment longer (its completion runs on another thread)."""
    import time

    from jaxcoll import runtime
    deadline = time.monotonic() + timeout_s
    while (held := runtime.communicator_memory())[1] != expected_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    return held


def settled_memory(timeout_s: float = 10.0) -> tuple[int, int]:
    """jaxcoll.runtime.communicator_memory() once the executables earlier tests dropped have gone: the same over
    five readings 20 ms apart (memory_after_release says why they may linger)."""
    import gc
    import time

    from jaxcoll import runtime
    gc.collect()
    deadline = time.monotonic() + timeout_s
    readings = [runtime.communicator_memory()]
    while time.monotonic() < deadline and (len(readings) < 5 or len(set(readings[-5:])) > 1):
        time.sleep(0.02)
        readings.append(runtime.communicator_memory())
    return readings[-1]
