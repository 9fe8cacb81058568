"""jaxcoll under jax.jit(shard_map) on a one-device mesh, compared with the same programs on jax.lax: the six
collectives, their gradients, a scan of 200 steps, the fused ops, and a lax.ragged_all_to_all through
jaxcoll.replace_collectives. test_cuda_jax.py runs these checks on the CPU device and on a GPU; on a GPU it also
runs this file as a program under XLA's command buffers (CUDA graphs) on and off, which XLA_FLAGS fixes for the
life of a process:

    python tests/cuda_jax_cases.py --platform cuda     # every check; prints one "ok <check>" line each

With one device every group has one rank, so the lowering is told to emit jaxcoll's custom call even then
(`lower_single_rank_groups`): registration, lowering, the handler's stages and the executor kernel all run.
Inputs are small integers, so sums, products and their gradients are exact and compare bit for bit whatever
order each side computes in (TF32 included).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxcoll
from jaxcoll import fused
from jaxcoll.lowering import custom_call

AXIS = "i"
SCAN_STEPS = 200


@contextlib.contextmanager
def single_rank_calls():
    """One-rank groups lower to jaxcoll's custom call (not to the identity) while inside."""
    before = custom_call.lower_single_rank_groups
    custom_call.lower_single_rank_groups = True
    try:
        yield
    finally:
        custom_call.lower_single_rank_groups = before


def mesh_of(device):
    return jax.make_mesh((1,), (AXIS,), devices=[device])


def sharded(mesh, x):
    return jax.device_put(np.asarray(x), NamedSharding(mesh, P(AXIS)))


def small_ints(shape, dtype=np.float32, seed=0, low=-4, high=5):
    return np.random.default_rng(seed).integers(low, high, shape).astype(dtype)


def on_mesh(mesh, body, nargs=1, out_specs=P(AXIS)):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(AXIS),) * nargs, out_specs=out_specs))


def assert_lowers_to_jaxcoll(f, *args, what: str):
    hlo = f.lower(*args).as_text()
    assert "jaxcoll_" in hlo, f"{what}: no jaxcoll custom call in the lowered program"


def assert_same(got, want, what: str):
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f"{what}, output {i}")


# ---------------------------------------------------------------------------------------------------------------
# The checks: each takes a device and raises AssertionError naming what differs
# ---------------------------------------------------------------------------------------------------------------
def collective_pairs():
    """name -> (jaxcoll body, jax.lax body) of one array; the six collectives, and the reductions' ops."""
    return {
        "all_reduce sum": (lambda x: jaxcoll.all_reduce(x, AXIS), lambda x: lax.psum(x, AXIS)),
        "all_reduce max": (lambda x: jaxcoll.all_reduce(x, AXIS, op="max"), lambda x: lax.pmax(x, AXIS)),
        "all_reduce min": (lambda x: jaxcoll.all_reduce(x, AXIS, op="min"), lambda x: lax.pmin(x, AXIS)),
        "all_gather": (lambda x: jaxcoll.all_gather(x, AXIS, axis=1, tiled=True),
                       lambda x: lax.all_gather(x, AXIS, axis=1, tiled=True)),
        "reduce_scatter": (lambda x: jaxcoll.reduce_scatter(x, AXIS, scatter_dimension=1, tiled=True),
                           lambda x: lax.psum_scatter(x, AXIS, scatter_dimension=1, tiled=True)),
        "all_to_all": (lambda x: jaxcoll.all_to_all(x, AXIS, 1, 0, tiled=True),
                       lambda x: lax.all_to_all(x, AXIS, 1, 0, tiled=True)),
        "ppermute": (lambda x: jaxcoll.ppermute(x, AXIS, [(0, 0)]), lambda x: lax.ppermute(x, AXIS, [(0, 0)])),
        "broadcast": (lambda x: jaxcoll.broadcast(x, AXIS, root=0),
                      lambda x: lax.all_gather(x, AXIS, axis=0, tiled=False)[0]),
    }


def check_collectives(device) -> str:
    """Each collective inside jit(shard_map), float32 and bfloat16, called three times (the group's counters
    advance on the device), equal to jax.lax's."""
    mesh = mesh_of(device)
    for dtype in (np.float32, jnp.bfloat16):
        x = sharded(mesh, small_ints((4, 66), dtype))
        for name, (ours, theirs) in collective_pairs().items():
            f = on_mesh(mesh, ours)
            assert_lowers_to_jaxcoll(f, x, what=name)
            want = on_mesh(mesh, theirs)(x)
            for call in range(3):
                assert_same(f(x), want, f"{name} ({np.dtype(dtype).name}), call {call}")
    return f"{len(collective_pairs())} collectives x 2 dtypes x 3 calls"


def check_gradients(device) -> str:
    """jax.grad through each collective (its transpose runs on jaxcoll too) equals jax.grad through jax.lax's;
    max and min are not differentiable, on either side."""
    mesh = mesh_of(device)
    x = sharded(mesh, small_ints((4, 66)))
    weights = sharded(mesh, small_ints((4, 66), seed=1))
    pairs = {name: pair for name, pair in collective_pairs().items()
             if name not in ("all_reduce max", "all_reduce min")}
    for name, (ours, theirs) in pairs.items():
        def loss(body):
            def per_rank(x, c):
                y = body(x)
                return jnp.sum(y * y * c)[None]  # not linear: the forward collective stays in the program
            return lambda x, c: on_mesh(mesh, per_rank, nargs=2)(x, c).sum()

        g = jax.jit(jax.grad(loss(ours)))
        assert_lowers_to_jaxcoll(g, x, weights, what=f"grad of {name}")
        assert_same(g(x, weights), jax.grad(loss(theirs))(x, weights), f"grad of {name}")
    return f"grads of {len(pairs)} collectives"


def scan_program(reduce: Callable, gather: Callable, scatter: Callable, steps: int):
    """An integer recurrence of `steps` steps whose every step runs three collectives; a call that read a stale
    buffer or a counter off by one call changes every later step."""
    def body(carry, t):
        c = (reduce(carry) * 3 + t) % 1009
        c = scatter(gather(c)) + t % 7
        return c, c[0]

    def per_rank(x):
        return lax.scan(body, x, jnp.arange(steps, dtype=x.dtype))
    return per_rank


def check_scan(device, steps: int = SCAN_STEPS) -> str:
    """lax.scan of `steps` steps, each calling all_reduce, all_gather and reduce_scatter: every step's value
    equals the jax.lax program's."""
    mesh = mesh_of(device)
    x = sharded(mesh, small_ints((1, 130), np.int32, low=0, high=1000))
    ours = scan_program(lambda c: jaxcoll.all_reduce(c, AXIS),
                        lambda c: jaxcoll.all_gather(c, AXIS, axis=1, tiled=True),
                        lambda c: jaxcoll.reduce_scatter(c, AXIS, scatter_dimension=1, tiled=True), steps)
    theirs = scan_program(lambda c: lax.psum(c, AXIS), lambda c: lax.all_gather(c, AXIS, axis=1, tiled=True),
                          lambda c: lax.psum_scatter(c, AXIS, scatter_dimension=1, tiled=True), steps)
    f = on_mesh(mesh, ours)
    assert_lowers_to_jaxcoll(f, x, what="scan")
    got = f(x)
    assert np.asarray(got[1]).shape[0] == steps
    assert_same(got, on_mesh(mesh, theirs)(x), f"scan of {steps} steps")
    return f"scan of {steps} steps, 3 collectives a step"


def fused_pairs(chunks):
    """name -> (fused op, its jax.lax composition) of (x, w)."""
    return {
        "all_gather_matmul": (lambda x, w: fused.all_gather_matmul(x, w, AXIS, chunks=chunks),
                              lambda x, w: lax.all_gather(x, AXIS, axis=0, tiled=True) @ w),
        "matmul_reduce_scatter": (lambda x, w: fused.matmul_reduce_scatter(x, w, AXIS, chunks=chunks),
                                  lambda x, w: lax.psum_scatter(x @ w, AXIS, scatter_dimension=0, tiled=True)),
        "matmul_all_reduce": (lambda x, w: fused.matmul_all_reduce(x, w, AXIS, chunks=chunks),
                              lambda x, w: lax.psum(x @ w, AXIS)),
    }


def check_fused(device) -> str:
    """The fused ops, whole (chunks=1: the collective and one product) and split in pieces (chunks=2: at one rank,
    the pieces' products), values and gradients, equal to their jax.lax compositions."""
    mesh = mesh_of(device)
    x = sharded(mesh, small_ints((64, 48)))
    w = jax.device_put(small_ints((48, 32), seed=1), NamedSharding(mesh, P()))
    for chunks in (1, 2):
        for name, (ours, theirs) in fused_pairs(chunks).items():
            what = f"{name} (chunks={chunks})"

            def program(op):
                return jax.jit(jax.shard_map(op, mesh=mesh, in_specs=(P(AXIS), P()), out_specs=P(AXIS)))

            f = program(ours)
            if chunks == 1:  # split at p = 1, a ring has no hop: only matmul_all_reduce keeps a collective
                assert_lowers_to_jaxcoll(f, x, w, what=what)
            assert_same(f(x, w), program(theirs)(x, w), what)

            def loss(op):
                return lambda x, w: jnp.sum(program(op)(x, w) * jnp.arange(32, dtype=jnp.float32))

            assert_same(jax.grad(loss(ours), argnums=(0, 1))(x, w), jax.grad(loss(theirs), argnums=(0, 1))(x, w),
                        f"grads of {what}")
    return "3 fused ops x chunks 1, 2, values and grads"


def check_ragged(device) -> str:
    """lax.ragged_all_to_all through jaxcoll.replace_collectives (its blocks through jaxcoll's all_to_all, on this
    device's executor): two slices of one rank to itself, written at their offsets and nothing else touched, as the
    lax contract (numpy) says and, where XLA runs it (XLA:GPU; XLA:CPU has no ragged-all-to-all), as XLA's."""
    mesh = mesh_of(device)
    operand, output = small_ints((1, 6, 66)), np.full((1, 8, 66), -1, np.float32)
    slices = [np.array([v], np.int32) for v in ([0, 3], [2, 3], [1, 4], [2, 3])]
    want = output.copy()
    want[0, 1:3], want[0, 4:7] = operand[0, 0:2], operand[0, 3:6]

    def body(a, o, io, ss, oo, rs):
        return lax.ragged_all_to_all(a[0], o[0], io[0], ss[0], oo[0], rs[0], axis_name=AXIS)[None]
    program = on_mesh(mesh, body, nargs=6)
    f = jax.jit(jaxcoll.replace_collectives(program))
    args = [sharded(mesh, a) for a in (operand, output, *slices)]
    assert_lowers_to_jaxcoll(f, *args, what="ragged_all_to_all")
    assert_same(f(*args), want, "ragged_all_to_all against the lax contract")
    if device.platform != "cpu":
        assert_same(f(*args), program(*args), "ragged_all_to_all against XLA's")
    return "ragged_all_to_all through replace_collectives" + (", as XLA's" if device.platform != "cpu" else "")


CHECKS = {"collectives": check_collectives, "gradients": check_gradients, "scan": check_scan, "fused": check_fused,
          "ragged": check_ragged}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--platform", default="cuda", help="jax platform whose first device runs the checks")
    ap.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated, of: {', '.join(CHECKS)}")
    args = ap.parse_args(argv)
    names = [c for c in args.checks.split(",") if c]
    unknown = [c for c in names if c not in CHECKS]
    if unknown or not names:
        ap.error(f"--checks: {unknown or args.checks!r} not among {', '.join(CHECKS)}")
    try:
        device = jax.devices(args.platform)[0]
    except RuntimeError as e:
        sys.exit(f"no {args.platform} device: {e}")
    with single_rank_calls():
        print(f"device {device}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
        for name in names:
            print(f"ok {name}: {CHECKS[name](device)}", flush=True)


if __name__ == "__main__":
    main()
