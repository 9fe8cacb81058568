"""The programs test_multiprocess.py runs in every process of a jax.distributed job (started by
jaxcoll.launch): `python multiprocess_cases.py CASE`. Each case raises (exit code 1, traceback on stderr) when a
check fails and prints one line `ok CASE <what it checked>` when every check passed.

Every collective is compared with two references: XLA's own collective (gloo across processes, run in the same
processes on the same input) and numpy, applied to each group of the mesh from the global input. Inputs are
small integers, so sums compare bitwise whatever order each side reduces in.
"""

from __future__ import annotations

import os
import sys
import time

# CASE_UNSHARE=pid or mount: this process runs in a pid namespace of its own (its pid is 1 there), or in a mount
# namespace with a /dev/shm of its own (as containers on one kernel may be); the tests run it as root.
_UNSHARE = {"pid": ["unshare", "--pid", "--fork", "--kill-child"],
            "mount": ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$0" "$@"']}
if os.environ.get("CASE_UNSHARE") in _UNSHARE:
    os.execvp("unshare", [*_UNSHARE[os.environ.pop("CASE_UNSHARE")], sys.executable, *sys.argv])

import jaxcoll.distributed  # noqa: E402
import jaxcoll.launch  # noqa: E402

PROCESS, NPROCESSES = jaxcoll.launch.initialize()

import jax  # noqa: E402 - after the job is joined
import jax.experimental.multihost_utils  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jaxcoll  # noqa: E402

# -- meshes and data -----------------------------------------------------------------------------------------


def mesh_1d() -> Mesh:
    return Mesh(np.array(jax.devices()), ("i",))


def mesh_2d(crossing: str) -> Mesh:
    """A 2D mesh of every device: axis `crossing` ("x" or "y") runs across the processes, the other stays inside
    each process."""
    per = len(jax.local_devices())
    grid = np.array(jax.devices()).reshape(NPROCESSES, per)  # row p: process p's devices
    return Mesh(grid if crossing == "x" else grid.T, ("x", "y"))


def small_ints(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    lo = 0 if dtype.kind == "u" else -3
    return rng.integers(lo, 4, shape).astype(dtype)


def put(x: np.ndarray, mesh: Mesh):
    """The global array sharded over every mesh axis along its leading dimension (row-major over the axes)."""
    sharding = NamedSharding(mesh, P(tuple(mesh.axis_names)))
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def run(fn, mesh: Mesh, x):
    spec = P(tuple(mesh.axis_names))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec))(x)


def local_values(y) -> dict:
    """{global index of the shard: its values} for this process's shards."""
    return {tuple((s.start, s.stop) for s in shard.index): np.asarray(shard.data) for shard in y.addressable_shards}


def reference(kind: str, mesh: Mesh, axes: tuple, x: np.ndarray, **kw) -> np.ndarray:
    """numpy: collective `kind` over `axes` applied to every group of `mesh`, each device holding the block of x
    that put() gives it; returns the global result laid out the same way."""
    names, shape = mesh.axis_names, mesh.devices.shape
    blocks = np.split(x, int(np.prod(shape)))
    sizes = dict(zip(names, shape))
    groups: dict[tuple, dict[int, int]] = {}
    for linear, coords in enumerate(np.ndindex(*shape)):
        at = dict(zip(names, coords))
        rank = 0
        for a in axes:
            rank = rank * sizes[a] + at[a]
        groups.setdefault(tuple(at[a] for a in names if a not in axes), {})[rank] = linear
    out = [None] * len(blocks)
    for members in groups.values():
        n = len(members)
        ins = [blocks[members[r]] for r in range(n)]
        wide = np.stack([b.astype(np.float64) if b.dtype != np.bool_ else b for b in ins])
        for r in range(n):
            if kind in ("sum", "max", "min"):
                red = {"sum": np.sum, "max": np.max, "min": np.min}[kind](wide, axis=0)
                res = red.astype(ins[0].dtype)
            elif kind == "all_gather":
                res = np.concatenate(ins)
            elif kind == "reduce_scatter":
                res = np.split(wide.sum(axis=0).astype(ins[0].dtype), n)[r]
            elif kind == "all_to_all":
                res = np.concatenate([np.split(ins[s], n)[r] for s in range(n)])
            elif kind == "ppermute":
                src = [s for s, d in kw["perm"] if d == r]
                res = ins[src[0]] if src else np.zeros_like(ins[0])
            elif kind == "broadcast":
                res = ins[kw["root"]]
            else:
                raise ValueError(kind)
            out[members[r]] = res
    return np.concatenate(out)


def check(label: str, mesh: Mesh, axes, ours, theirs, x_np: np.ndarray, kind: str, **kw) -> None:
    """ours == XLA's collective (theirs) == numpy, on this process's shards."""
    axes_t = axes if isinstance(axes, tuple) else (axes,)
    x = put(x_np, mesh)
    got, want = local_values(run(ours, mesh, x)), local_values(run(theirs, mesh, x))
    expect = reference(kind, mesh, axes_t, x_np, **kw)
    for index, value in got.items():
        np.testing.assert_array_equal(value, want[index], err_msg=f"{label}: jaxcoll vs XLA at {index}")
        np.testing.assert_array_equal(value, expect[tuple(slice(a, b) for a, b in index)],
                                      err_msg=f"{label}: jaxcoll vs numpy at {index}")


AXES = [("1d", "i"), ("2d-x", "x"), ("2d-x", "y"), ("2d-x", ("x", "y")), ("2d-y", "y"), ("2d-y", ("y", "x"))]


def meshes():
    return {"1d": mesh_1d(), "2d-x": mesh_2d("x"), "2d-y": mesh_2d("y")}


# -- cases ---------------------------------------------------------------------------------------------------

def case_collectives() -> str:
    """The six collectives, every op of all_reduce, three dtypes, over axes inside and across processes."""
    rng = np.random.default_rng(0)
    ms = meshes()
    nchecks = 0
    for mesh_name, axes in AXES:
        mesh = ms[mesh_name]
        axes_t = axes if isinstance(axes, tuple) else (axes,)
        n = int(np.prod([mesh.shape[a] for a in axes_t]))
        ndev = mesh.devices.size
        label = f"{mesh_name} over {axes}"
        for dtype in (np.float32, jnp.bfloat16, np.int32):
            x = small_ints(rng, (ndev * n * 2, 3), dtype)
            for op, ref in (("sum", lax.psum), ("max", lax.pmax), ("min", lax.pmin)):
                check(f"all_reduce {op} {label}", mesh, axes, lambda v, op=op: jaxcoll.all_reduce(v, axes, op=op),
                      lambda v, ref=ref: ref(v, axes), x, op)
            check(f"all_gather {label}", mesh, axes, lambda v: jaxcoll.all_gather(v, axes, tiled=True),
                  lambda v: lax.all_gather(v, axes, tiled=True), x, "all_gather")
            check(f"reduce_scatter {label}", mesh, axes, lambda v: jaxcoll.reduce_scatter(v, axes, tiled=True),
                  lambda v: lax.psum_scatter(v, axes, tiled=True), x, "reduce_scatter")
            check(f"all_to_all {label}", mesh, axes, lambda v: jaxcoll.all_to_all(v, axes, 0, 0, tiled=True),
                  lambda v: lax.all_to_all(v, axes, 0, 0, tiled=True), x, "all_to_all")
            # ppermute over axes in mesh order: how jax numbers a tuple in another order changed in jax 0.11
            # (test_collectives covers that contract); here the point is the processes.
            in_order = tuple(sorted(axes_t, key=mesh.axis_names.index))
            perm = [(r, (r + 1) % n) for r in range(n)]
            check(f"ppermute {label}", mesh, in_order, lambda v: jaxcoll.ppermute(v, in_order, perm),
                  lambda v: lax.ppermute(v, in_order, perm), x, "ppermute", perm=perm)
            # A shift that stops short: rank n - 1 is no target and gets zeros.
            partial = [(r, r - 1) for r in range(1, n)] or [(0, 0)]
            check(f"ppermute, partial, {label}", mesh, in_order, lambda v: jaxcoll.ppermute(v, in_order, partial),
                  lambda v: lax.ppermute(v, in_order, partial), x, "ppermute", perm=partial)
            root = n - 1
            check(f"broadcast {label}", mesh, axes, lambda v: jaxcoll.broadcast(v, axes, root=root),
                  lambda v: lax.all_gather(v, axes)[root], x, "broadcast", root=root)
            nchecks += 9
    return f"{nchecks} checks, hosts {jaxcoll.distributed.world().hosts}"


def case_dtypes() -> str:
    """Every dtype jaxcoll supports, through each collective over an axis that crosses the processes."""
    jax.config.update("jax_enable_x64", True)  # for float64 and int64
    from jaxcoll.lowering.dtypes import SUPPORTED
    rng = np.random.default_rng(3)
    mesh = mesh_1d()
    n = mesh.devices.size
    perm = [(r, (r + 3) % n) for r in range(n)]
    names = []
    for dtype in SUPPORTED:
        x = small_ints(rng, (n * n * 2, 3), dtype)
        label = np.dtype(dtype).name
        ops = (("max", lax.pmax), ("min", lax.pmin)) + ((("sum", lax.psum),) if dtype != np.bool_ else ())
        for op, ref in ops:
            check(f"all_reduce {op} {label}", mesh, "i", lambda v, op=op: jaxcoll.all_reduce(v, "i", op=op),
                  lambda v, ref=ref: ref(v, "i"), x, op)
        check(f"all_gather {label}", mesh, "i", lambda v: jaxcoll.all_gather(v, "i", tiled=True),
              lambda v: lax.all_gather(v, "i", tiled=True), x, "all_gather")
        if dtype != np.bool_:
            check(f"reduce_scatter {label}", mesh, "i", lambda v: jaxcoll.reduce_scatter(v, "i", tiled=True),
                  lambda v: lax.psum_scatter(v, "i", tiled=True), x, "reduce_scatter")
        check(f"all_to_all {label}", mesh, "i", lambda v: jaxcoll.all_to_all(v, "i", 0, 0, tiled=True),
              lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True), x, "all_to_all")
        check(f"ppermute {label}", mesh, "i", lambda v: jaxcoll.ppermute(v, "i", perm),
              lambda v: lax.ppermute(v, "i", perm), x, "ppermute", perm=perm)
        check(f"broadcast {label}", mesh, "i", lambda v: jaxcoll.broadcast(v, "i", root=5),
              lambda v: lax.all_gather(v, "i")[5], x, "broadcast", root=5)
        names.append(label)
    return f"dtypes {names}"


def case_algorithms() -> str:
    """Every built-in all_reduce and all_gather algorithm across processes, and an odd size."""
    from jaxcoll import algorithms
    rng = np.random.default_rng(1)
    mesh = mesh_1d()
    n = mesh.devices.size
    names = []
    for name in algorithms.known("all_reduce"):
        x = small_ints(rng, (n * 7, 5), np.float32)
        check(f"all_reduce {name}", mesh, "i", lambda v, a=name: jaxcoll.all_reduce(v, "i", algorithm=a),
              lambda v: lax.psum(v, "i"), x, "sum")
        names.append(name)
    for name in algorithms.known("all_gather"):
        x = small_ints(rng, (n * 3, 2), np.int32)
        check(f"all_gather {name}", mesh, "i", lambda v, a=name: jaxcoll.all_gather(v, "i", tiled=True, algorithm=a),
              lambda v: lax.all_gather(v, "i", tiled=True), x, "all_gather")
        names.append(name)
    return f"algorithms {names}"


def case_synthesized() -> str:
    """Plans synthesized for the job's own topology (jaxcoll.topology.job) run across its processes."""
    from jaxcoll import synth, topology
    t = topology.job()
    rng = np.random.default_rng(4)
    mesh = mesh_1d()
    n = mesh.devices.size
    names = []
    for collective, ours, theirs, kind in (
            ("all_reduce", jaxcoll.all_reduce, lambda v: lax.psum(v, "i"), "sum"),
            ("all_gather", lambda v, a, algorithm: jaxcoll.all_gather(v, a, tiled=True, algorithm=algorithm),
             lambda v: lax.all_gather(v, "i", tiled=True), "all_gather"),
            ("reduce_scatter", lambda v, a, algorithm: jaxcoll.reduce_scatter(v, a, tiled=True, algorithm=algorithm),
             lambda v: lax.psum_scatter(v, "i", tiled=True), "reduce_scatter")):
        plan = synth.synthesize(t, collective, 1 << 16)
        x = small_ints(rng, (n * n * 4, 2), np.float32)
        check(f"{collective} {plan.name}", mesh, "i", lambda v, o=ours, p=plan: o(v, "i", algorithm=p), theirs,
              x, kind)
        names.append(f"{collective}:{plan.name}")
    return f"{t.name} {names}"


def case_loops() -> str:
    """A 200-step scan of all_reduce, two independent collectives per step and their gradient: same as XLA's."""
    mesh = mesh_2d("x")
    rng = np.random.default_rng(2)
    x_np = small_ints(rng, (mesh.devices.size * 4, 3), np.float32) / 8

    def steps(all_reduce, all_gather):
        def body(v):
            def step(c, _):
                a = all_reduce(c, "x") * 0.5
                b = all_gather(c, "y")
                return a + b.sum(0) * 0.01, None
            out, _ = lax.scan(step, v, None, length=200)
            return out
        return body

    ours = steps(lambda v, a: jaxcoll.all_reduce(v, a), lambda v, a: jaxcoll.all_gather(v, a))
    theirs = steps(lambda v, a: lax.psum(v, a), lambda v, a: lax.all_gather(v, a))
    x = put(x_np, mesh)
    got, want = local_values(run(ours, mesh, x)), local_values(run(theirs, mesh, x))
    for index, value in got.items():
        np.testing.assert_allclose(value, want[index], rtol=1e-6, err_msg=f"scan at {index}")

    def loss(f):
        return lambda v: jnp.sum(f(v, ("x", "y")) ** 2)
    gours = jax.grad(loss(lambda v, a: jaxcoll.all_reduce(v, a)))
    gtheirs = jax.grad(loss(lambda v, a: lax.psum(v, a)))
    got, want = local_values(run(gours, mesh, x)), local_values(run(gtheirs, mesh, x))
    for index, value in got.items():
        np.testing.assert_allclose(value, want[index], rtol=1e-6, err_msg=f"grad at {index}")
    return f"scan of 200 steps, two collectives per step, grad, hosts {jaxcoll.distributed.world().hosts}"


def case_replace() -> str:
    """A program written with jax.lax collectives, through jaxcoll.replace_collectives and in a
    jaxcoll.replacing_collectives block, over an axis across the processes and one inside them: values and
    gradient as XLA's (gloo), every collective replaced."""
    mesh = mesh_2d("x")
    rng = np.random.default_rng(3)
    x_np = small_ints(rng, (mesh.devices.size * 4, 8), np.float32)

    def program(v):
        a = lax.pmean(v, "x") + lax.psum_scatter(lax.all_gather(v, "y", axis=1, tiled=True), "y",
                                                 scatter_dimension=1, tiled=True)
        b = lax.ppermute(v, "x", [(i, (i + 1) % NPROCESSES) for i in range(NPROCESSES)])
        return lax.all_to_all(a * b, "y", 0, 0, tiled=True) + lax.pmax(lax.stop_gradient(v), ("x", "y"))

    transformed = jaxcoll.replace_collectives(program)
    x = put(x_np, mesh)
    got, want = local_values(run(transformed, mesh, x)), local_values(run(program, mesh, x))
    for index, value in got.items():
        np.testing.assert_array_equal(value, want[index], err_msg=f"values at {index}")
    assert transformed.report.entries and not transformed.report.left_to_xla, transformed.report

    # A polynomial loss: on small integers every value and cotangent is exact in float32, so what differs is the
    # collectives' doing. (Through tanh, where it saturates, jax 0.12's differently fused programs differ by ~1e-5.)
    def loss(f):
        return lambda v: jnp.sum(f(v) ** 2)
    grad_got = local_values(run(jax.grad(loss(transformed)), mesh, x))
    grad_want = local_values(run(jax.grad(loss(program)), mesh, x))
    for index, value in grad_got.items():
        np.testing.assert_allclose(value, grad_want[index], rtol=1e-5, atol=1e-6, err_msg=f"grad at {index}")
    # The context form: the untransformed program and its gradient, lowered in the block.
    with jaxcoll.replacing_collectives() as report:
        got = local_values(run(program, mesh, x))
        grad_got = local_values(run(jax.grad(loss(program)), mesh, x))
    for index, value in got.items():
        np.testing.assert_array_equal(value, want[index], err_msg=f"values in the block at {index}")
    for index, value in grad_got.items():
        np.testing.assert_allclose(value, grad_want[index], rtol=1e-5, atol=1e-6,
                                   err_msg=f"grad in the block at {index}")
    assert report.entries and not report.left_to_xla, report
    replaced = sorted({e.collective for e in transformed.report.replaced})
    return f"replaced {replaced}, values and gradient as XLA's (transform and block), " \
           f"hosts {jaxcoll.distributed.world().hosts}"


def case_replace_groups_ragged_unreduced() -> str:
    """Through jaxcoll.replace_collectives, across the processes: collectives over axis_index_groups whose groups
    span the processes (strided, and listed out of order), as XLA's (gloo); a ragged_all_to_all, against the lax
    contract in numpy (XLA:CPU has none); an FSDP gradient through jax's reduced all_gather and unreduced
    reduce_scatter, as XLA's. Nothing left to XLA."""
    mesh = mesh_1d()
    n = mesh.devices.size
    rng = np.random.default_rng(5)
    x = put(small_ints(rng, (n * 2, 8), np.float32), mesh)
    strided = [list(range(g, n, 2)) for g in range(2)]
    paired = [[p, p + n // 2] for p in reversed(range(n // 2))]

    def grouped(v):
        return (lax.psum(v, "i", axis_index_groups=strided) + lax.all_gather(v, "i", axis_index_groups=paired,
                                                                              tiled=True)[:2]
                + lax.psum_scatter(jnp.tile(v, (2, 1)), "i", axis_index_groups=paired, tiled=True)
                + lax.all_to_all(v, "i", 0, 0, axis_index_groups=paired, tiled=True))
    spec = P("i")
    program = jax.shard_map(grouped, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    transformed = jaxcoll.replace_collectives(program)
    got, want = local_values(jax.jit(transformed)(x)), local_values(jax.jit(program)(x))
    for index, value in got.items():
        np.testing.assert_array_equal(value, want[index], err_msg=f"axis_index_groups at {index}")
    reports = [transformed.report]

    # ragged: rank r sends (r + d) % 3 rows to rank d, packed in its operand, placed from row 1 at d in sender order.
    sizes = np.array([[(r + d) % 3 for d in range(n)] for r in range(n)], np.int32)
    input_offsets = np.cumsum(sizes, axis=1) - sizes
    output_offsets = 1 + np.cumsum(sizes, axis=0) - sizes
    operand = small_ints(rng, (n, 2 * n, 2), np.float32)
    output = np.full((n, 3 * n, 2), -1, np.float32)
    expected = output.copy()
    for r in range(n):
        for d in range(n):
            expected[d, output_offsets[r, d]:output_offsets[r, d] + sizes[r, d]] = \
                operand[r, input_offsets[r, d]:input_offsets[r, d] + sizes[r, d]]

    def ragged(a, o, io, ss, oo, rs):
        return lax.ragged_all_to_all(a[0], o[0], io[0], ss[0], oo[0], rs[0], axis_name="i")[None]
    ragged = jaxcoll.replace_collectives(jax.shard_map(ragged, mesh=mesh, in_specs=(spec,) * 6, out_specs=spec))
    arguments = [put(a, mesh) for a in (operand, output, input_offsets.astype(np.int32), sizes,
                                         output_offsets.astype(np.int32), sizes.T.copy())]
    for index, value in local_values(jax.jit(ragged)(*arguments)).items():
        np.testing.assert_array_equal(value, expected[index[0][0]:index[0][1]], err_msg=f"ragged at {index}")
    reports.append(ragged.report)

    checked = ["axis_index_groups", "ragged_all_to_all"]
    from jaxcoll import _jax
    if "all_gather_reduced" in _jax.lax_collective_primitives():
        explicit = Mesh(np.array(jax.devices()), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))

        def fsdp(w, batch):
            return lax.psum((jnp.tanh(batch @ lax.all_gather(w, "i", to="reduced", tiled=True)) ** 2).sum(), "i")
        loss = jax.shard_map(fsdp, mesh=explicit, in_specs=(spec, spec), out_specs=P())
        w, batch = put(small_ints(rng, (4 * n, 3), np.float32) / 4, explicit), \
            put(small_ints(rng, (n, 4 * n), np.float32) / 4, explicit)
        replaced = jaxcoll.replace_collectives(loss)
        got, want = jax.jit(jax.grad(replaced))(w, batch), jax.jit(jax.grad(loss))(w, batch)
        for index, value in local_values(got).items():
            np.testing.assert_allclose(value, local_values(want)[index], rtol=1e-5, atol=1e-6,
                                       err_msg=f"FSDP gradient at {index}")
        reports.append(replaced.report)
        checked.append("reduced/unreduced")
    for report in reports:
        assert report.entries and not report.left_to_xla, report
    return f"{', '.join(checked)} across {NPROCESSES} processes as XLA's and numpy, hosts " \
           f"{jaxcoll.distributed.world().hosts}"


def case_lowering_sets_up_nothing() -> str:
    """Lowering a collective across processes only emits IR: the runtime is set up for the job (the native world,
    the network connections) when the program is compiled; the program then runs as if it had been before."""
    from jaxcoll import runtime
    set_up = []
    for name in ("configure_world", "net_listen", "net_connect"):
        def recording(*args, _name=name, _set_up=getattr(runtime, name)):
            set_up.append(_name)
            return _set_up(*args)
        setattr(runtime, name, recording)
    mesh = mesh_1d()
    x_np = small_ints(np.random.default_rng(0), (mesh.devices.size * 8,), np.float32)
    x = put(x_np, mesh)
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.all_reduce(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    lowered = f.lower(x)
    assert "jaxcoll_all_reduce" in lowered.as_text()
    assert set_up == [] and jaxcoll.distributed.world() is None, (set_up, jaxcoll.distributed.world())
    compiled = lowered.compile()
    assert set_up[:1] == ["configure_world"] and jaxcoll.distributed.world() is not None, set_up
    y = compiled(x)
    total = x_np.reshape(mesh.devices.size, -1).sum(0)
    for shard in y.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), total)
    return f"set up {set_up} when compiled, hosts {jaxcoll.distributed.world().hosts}"


def case_local_collectives_wait_for_no_peer() -> str:
    """Process 0 runs collectives over its own devices only; process 1 never runs jaxcoll (a short
    JAXCOLL_TIMEOUT): process 0 must not wait for it."""
    from jaxcoll import _jax
    client = _jax.distributed_client()
    if PROCESS == 1:
        jax.devices()  # the CPU client starts once every process has given its devices
        client.blocking_key_value_get("case/local_done", 120_000)
        return "never ran jaxcoll"
    mesh = Mesh(np.array(jax.local_devices()), ("i",))
    x_np = small_ints(np.random.default_rng(0), (mesh.devices.size * 8,), np.float32)
    start = time.monotonic()
    y = run(lambda v: jaxcoll.all_reduce(v, "i"), mesh, put(x_np, mesh))
    seconds = time.monotonic() - start
    total = x_np.reshape(mesh.devices.size, -1).sum(0)
    for shard in y.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), total)
    client.key_value_set("case/local_done", "1")
    assert jaxcoll.distributed.world() is None
    return f"in {seconds:.1f} s"


def case_large() -> str:
    """A call larger than the segments first made: the data segment grows, results stay right."""
    mesh = mesh_1d()
    n = mesh.devices.size
    for rows in (8, 1 << 16):
        x = (np.arange(n * rows, dtype=np.float32) % 7).reshape(n * rows, 1)
        check(f"all_reduce of {rows} rows", mesh, "i", lambda v: jaxcoll.all_reduce(v, "i"),
              lambda v: lax.psum(v, "i"), x, "sum")
    return f"segments grow, segments named {_segment_prefix()}"


def _segment_prefix(process: int = PROCESS) -> str:
    """How the segments process `process` of this job creates are named in /dev/shm (csrc/shared_memory.hpp)."""
    from jaxcoll import _jax
    token = _jax.distributed_client().blocking_key_value_get("jaxcoll/v1/token", 10_000)
    return f"jaxcoll-{token}-p{process}-"


def case_compressed() -> str:
    """Compressed all_reduce (int8, top-k) and Adasum over an axis across the processes: within the int8 bound of
    the numpy sum, equal to the numpy references of top-k and Adasum, the same on every rank."""
    import compress_reference as ref

    from jaxcoll.compress import Int8, TopK
    mesh = mesh_1d()
    n = mesh.devices.size
    x_np = np.random.default_rng(4).standard_normal((n, 512)).astype(np.float32)
    x = put(x_np, mesh)
    rows = lambda fn: np.concatenate([v for _, v in sorted(local_values(run(fn, mesh, x)).items())])  # noqa: E731

    int8 = rows(lambda v: jaxcoll.all_reduce(v, "i", compression=Int8(64)))
    flat = x_np.astype(np.float64)
    decoded = np.stack([ref.roundtrip(v, "int8", 64) for v in x_np]).sum(0)
    bound = sum(ref.bound(v, "int8", 64) for v in x_np) + ref.bound(decoded, "int8", 64) + n * 2.0 ** -23 * np.abs(
        x_np).sum(0)
    assert np.all(np.abs(int8 - flat.sum(0)) <= bound) and np.all(int8 == int8[0])
    topk = rows(lambda v: jaxcoll.all_reduce(v, "i", compression=TopK(k=16)))
    np.testing.assert_array_equal(topk[0], ref.numpy_topk(x_np, 16)[0])
    ada = rows(lambda v: jaxcoll.adasum(v, "i"))
    np.testing.assert_allclose(ada[0], ref.numpy_adasum([v.astype(np.float64) for v in x_np]), rtol=2e-5, atol=2e-5)

    # Hierarchical: exact over "y" (inside each process), int8 only over "x" (across the processes): the bound of
    # the outer hop on each process's exact partial sum s_p (device (x, y) holds row x * L + y).
    mesh2 = mesh_2d("x")
    hier = np.concatenate([v for _, v in sorted(local_values(run(
        lambda v: jaxcoll.all_reduce(v, ("x", "y"), compression=Int8(64), compress_axes="x"), mesh2,
        put(x_np, mesh2))).items())])
    s = flat.reshape(NPROCESSES, -1, 512).sum(1)
    decoded = np.stack([ref.roundtrip(v.astype(np.float32), "int8", 64) for v in s]).sum(0)
    bound = sum(ref.bound(v, "int8", 64) for v in s) + ref.bound(decoded, "int8", 64) + 2 * n * 2.0 ** -23 * np.abs(
        x_np).sum(0)
    assert np.all(np.abs(hier - flat.sum(0)) <= bound) and np.all(hier == hier[0])
    return f"int8, top-k, adasum and hierarchical int8 across processes, hosts {jaxcoll.distributed.world().hosts}"


def case_segments_private() -> str:
    """Every shared-memory segment jaxcoll made in this process is owner-only (0600)."""
    mesh = mesh_1d()
    x = put(np.ones((mesh.devices.size * 2,), np.float32), mesh)
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.all_reduce(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    f(x).block_until_ready()  # f alive: a dropped executable's call sites free their segments
    mine = [f for f in os.listdir("/dev/shm") if f.startswith(_segment_prefix())]
    assert mine, "no jaxcoll segment found in /dev/shm"
    modes = {f: oct(os.stat(os.path.join("/dev/shm", f)).st_mode & 0o777) for f in mine}
    assert all(m == "0o600" for m in modes.values()), modes
    return f"{len(mine)} segments, all 0600"


def case_scratch_private() -> str:
    """A plan whose scratch no other process names keeps it out of the shared segments: each rank copies its
    input into 8 chunks of scratch and puts the last to the rank at its place in the next process. The results
    are the ppermute's, and this process's data segments hold less than its ranks' scratch."""
    import re

    from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step
    mesh = mesh_1d()
    n = mesh.devices.size
    per = len(jax.local_devices())
    perm = tuple((r, (r + per) % n) for r in range(n))
    copies = 8

    def program(r):
        steps = tuple(Step(Op.COPY, (ChunkRef(r, Buffer.INPUT, 0),), (ChunkRef(r, Buffer.SCRATCH, j),))
                      for j in range(copies))
        last = Step(Op.PUT, (ChunkRef(r, Buffer.SCRATCH, copies - 1),), (ChunkRef((r + per) % n, Buffer.OUTPUT, 0),))
        return RankProgram(1, 1, copies, lanes=(Lane(steps + (last,)),))

    plan = Plan(Collective.PPERMUTE, n, tuple(program(r) for r in range(n)), name="through-scratch", perm=perm)
    rows = 1 << 16  # float32 a rank: 256 KiB, and 2 MiB of scratch
    x_np = small_ints(np.random.default_rng(5), (n * rows,), np.float32)
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.ppermute(v, "i", perm, algorithm=plan), mesh=mesh, in_specs=P("i"),
                              out_specs=P("i")))
    got = local_values(f(put(x_np, mesh)))  # f alive below: its call site keeps its segments
    expect = reference("ppermute", mesh, ("i",), x_np, perm=perm)
    for index, value in got.items():
        np.testing.assert_array_equal(value, expect[tuple(slice(a, b) for a, b in index)], err_msg=f"at {index}")
    prefix = _segment_prefix()
    data = [name for name in os.listdir("/dev/shm") if re.fullmatch(re.escape(prefix) + r"d\d+", name)]
    held = sum(os.stat(os.path.join("/dev/shm", name)).st_size for name in data)
    scratch = per * copies * rows * 4
    assert data and held < scratch, f"data segments {data} hold {held} bytes, the ranks' scratch is {scratch}"
    return f"{len(data)} data segments of {held} bytes, {scratch} bytes of scratch kept private"


# -- faults: the surviving processes print the error they got ------------------------------------------------

def _fault_call(algorithm="auto"):
    mesh = mesh_1d()
    x = put(np.ones((mesh.devices.size * 4,), np.float32), mesh)
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.all_reduce(v, "i", algorithm=algorithm), mesh=mesh,
                              in_specs=P("i"), out_specs=P("i")))
    return f, x


def _report(fn, everyone_reports: bool = False) -> str:
    """Run fn; print the error it raised as `error <seconds> <message>` (the test reads it); then leave at once,
    without jax.distributed's shutdown barrier, which would wait for the peer that is gone. With
    `everyone_reports` (every process is expected to fail), wait first until every process has printed: process
    0 hosts the coordination service, and a peer still in a call to it when it exits is aborted before it prints."""
    start = time.monotonic()
    try:
        fn()
    except Exception as e:  # the error under test
        print("error", f"{time.monotonic() - start:.2f}", " ".join(str(e).split()), flush=True)
        if everyone_reports:
            from jaxcoll import _jax
            client = _jax.distributed_client()
            client.key_value_set(f"case/reported/{PROCESS}", "1")
            for q in range(NPROCESSES):
                client.blocking_key_value_get(f"case/reported/{q}", 30_000)
        os._exit(0)
    print("noerror", flush=True)
    os._exit(0)


def case_exit_between_calls() -> str:
    f, x = _fault_call()
    f(x).block_until_ready()
    if PROCESS == 1:
        os._exit(0)
    time.sleep(1.0)
    _report(lambda: f(x).block_until_ready())


def case_exit_after_call() -> str:
    """Every process leaves as soon as its last call returns, as a job's processes do after the last step
    (_report leaves with os._exit: no shutdown barrier, which would wait for a peer already gone): each call
    must still finish, correct, in every process."""
    f, x = _fault_call()

    def call_and_check():
        y = f(x)
        for shard in y.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data),
                                          np.full(shard.data.shape, jax.device_count(), np.float32))
    _report(call_and_check)


def case_fails_and_exits() -> str:
    """Process 1 (a short JAXCOLL_TIMEOUT) gives up waiting for process 0 and leaves at once, as a program that
    stops on an error does; process 0, arriving later, must learn why from process 1, not only that it left."""
    f, x = _fault_call()
    f = f.lower(x).compile()  # both compile before either waits: process 1 waits at most 2 s
    jax.experimental.multihost_utils.sync_global_devices("fails_and_exits compiled")
    f(x).block_until_ready()
    if PROCESS == 0:
        time.sleep(6.0)  # past process 1's timeout (2 s), so its call fails first, alone
    _report(lambda: f(x).block_until_ready())


def case_killed_mid_call() -> str:
    f, x = _fault_call()
    f(x).block_until_ready()
    if PROCESS == 1:
        # Arrive, then die while the call waits for process 0.
        import signal
        import threading
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        f(x).block_until_ready()
        time.sleep(60)
    time.sleep(2.5)
    _report(lambda: f(x).block_until_ready())


def case_never_arrives() -> str:
    f, x = _fault_call()
    f(x).block_until_ready()
    if PROCESS == 1:
        time.sleep(60)  # alive, but never calls again
        os._exit(0)
    _report(lambda: f(x).block_until_ready())


def case_never_arrives_traced() -> str:
    """never_arrives, with process 0's failing call traced to $TRACE_PATH (its file written as the block ends in the
    call's error)."""
    f, x = _fault_call()
    f(x).block_until_ready()
    if PROCESS == 1:
        time.sleep(20)  # alive past process 0's timeout, but never calls again
        os._exit(0)

    def traced():
        with jaxcoll.trace(os.environ["TRACE_PATH"]):
            f(x).block_until_ready()
    _report(traced)


def case_never_starts_jaxcoll() -> str:
    """Process 1 joins the job (jax.distributed, and its devices: the CPU client waits for every process's) but
    never reaches jaxcoll: a process that never starts its part."""
    if PROCESS == 1:
        jax.devices()
        time.sleep(60)
        os._exit(0)
    f, x = _fault_call()
    _report(lambda: f(x).block_until_ready())


def case_different_plan() -> str:
    f, x = _fault_call(algorithm="ring" if PROCESS == 1 else "two_shot")
    _report(lambda: f(x).block_until_ready(), everyone_reports=True)


def case_different_version() -> str:
    if PROCESS == 1:
        jaxcoll.__version__ = "0.0.0-other"
    f, x = _fault_call()
    _report(lambda: f(x).block_until_ready(), everyone_reports=True)


def case_port_taken() -> str:
    # Process 1 was told to listen on a port the test holds (JAXCOLL_NET_PORT).
    f, x = _fault_call()
    _report(lambda: f(x).block_until_ready(), everyone_reports=True)


def case_wrong_token() -> str:
    """A connection to a process's network port that presents another token is closed, and the job goes on."""
    import json
    import socket
    import struct

    from jaxcoll import _jax, runtime
    f, x = _fault_call()
    f(x).block_until_ready()
    if PROCESS == 0:
        peer = json.loads(_jax.distributed_client().blocking_key_value_get("jaxcoll/v1/net/1", 10_000))
        with socket.create_connection((peer["address"], peer["port"]), timeout=10) as s:
            s.sendall(struct.pack("<Qii32s", 0x4F4C4C4548584A43, 0, 0, b"0" * 32))  # a hello with a wrong token
            closed = s.recv(1) == b""
        assert closed, "the connection with a wrong token was not closed"
    jax.experimental.multihost_utils.sync_global_devices("token checked")
    f(x).block_until_ready()
    return f"refused {runtime._jaxcoll.net_refused()}"


def case_gpu_lowering() -> str:
    """The custom calls a program over GPUs of this job lowers to (lowered for XLA's CUDA platform on these CPU
    devices; nothing runs): one line `lowered <label> <json>` per program, read by test_multiprocess_cuda.py.
    Run as 4 processes x 2 devices on 2 "hosts" (JAXCOLL_HOST), mesh ("x", "y") = (2, 4): x crosses the hosts, y
    the 2 processes of a host."""
    import json
    import re

    from jaxcoll.lowering import host_phases

    grid = np.array(jax.devices()).reshape(2, 4)  # row h: the devices of host h's two processes
    mesh = Mesh(grid, ("x", "y"))
    spec = P(("x", "y"))
    x = jax.ShapeDtypeStruct((8 * 8,), np.float32, sharding=NamedSharding(mesh, spec))

    def lowered(label, fn, out_spec):
        f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=out_spec))
        try:
            text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
        except Exception as e:  # the test reads the message
            print("lowered", label, json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
            return
        calls = []
        for target, attrs in re.findall(r"stablehlo.custom_call @(\w+)\((.*?)\n", text):
            call = {"target": target}
            for name in ("processes", "groups", "pairs"):
                m = re.search(r"\b" + name + r" = dense<(\[[-\d, ]*\]|-?\d+)> : tensor<(\d+)x", attrs)
                if m:  # a splat (one value for all) prints as dense<v>
                    values = json.loads(m.group(1))
                    call[name] = values if isinstance(values, list) else [values] * int(m.group(2))
                elif re.search(r"\b" + name + r" = dense<> : tensor<0x", attrs):
                    call[name] = []
            for name in ("collective", "root", "group_size"):
                m = re.search(r"\b" + name + r" = (-?\d+) : i", attrs)
                if m and "jaxcoll_network" == target:
                    call[name] = int(m.group(1))
            calls.append(call)
        print("lowered", label, json.dumps({"calls": calls}), flush=True)

    lowered("within_host", lambda v: jaxcoll.all_reduce(v, "y"), P("x"))
    lowered("network_missing", lambda v: jaxcoll.all_reduce(v, ("x", "y")), P())
    # The phases as they would lower where the network steps can run (a CUDA build against a jaxlib with the
    # collectives extension), shown here by passing the check.
    host_phases.check_network_steps = lambda api_name: None
    lowered("all_reduce", lambda v: jaxcoll.all_reduce(v, ("x", "y")), P())
    lowered("reduce_scatter", lambda v: jaxcoll.reduce_scatter(v, ("x", "y"), tiled=True), spec)
    lowered("all_gather_rails", lambda v: jaxcoll.all_gather(v, "x", tiled=True), spec)
    lowered("all_to_all", lambda v: jaxcoll.all_to_all(v, ("x", "y"), 0, 0, tiled=True), spec)
    lowered("broadcast", lambda v: jaxcoll.broadcast(v, ("x", "y"), root=5), spec)
    # rank r sends to r + 4 (its peer on the other host); ranks 0-3 are no target and get zeros.
    lowered("ppermute", lambda v: jaxcoll.ppermute(v, ("x", "y"), [(r, r + 4) for r in range(4)]), spec)
    lowered("all_to_all_algorithm", lambda v: jaxcoll.all_to_all(v, ("x", "y"), 0, 0, tiled=True,
                                                                  algorithm="direct"), spec)
    return f"hosts {jaxcoll.distributed.layout().hosts}"


def _exchange(fingerprint=7, bus_of_rank2="gpu-2", publish=True, everyone_reports=True) -> None:
    """Process p offers ranks 2p and 2p+1 of a CUDA group over 4 ranks (csrc/cuda/slot_exchange.hpp), with empty
    slot handles; prints `blocks N` when the exchange completes, else `error <seconds> <message>`."""
    from jaxcoll import runtime
    jaxcoll.distributed.connect()
    buses = [f"gpu-{2 * PROCESS}", f"gpu-{2 * PROCESS + 1}"]
    if PROCESS == 1:
        buses[0] = bus_of_rank2
    if not publish:
        time.sleep(30)
        os._exit(0)

    def exchange():
        blocks = runtime._jaxcoll.cuda_exchange_offers(
            callsite=1, group=0, processes=[0, 0, 1, 1], fingerprint=fingerprint if PROCESS == 1 else 7,
            protocol=2, most_blocks=4 - 2 * PROCESS, ranks=[2 * PROCESS, 2 * PROCESS + 1], buses=buses,
            timeout_s=3.0)
        print("blocks", blocks, flush=True)
    _report(exchange, everyone_reports=everyone_reports)


def case_exchange_agree() -> str:
    _exchange()


def case_exchange_different_plan() -> str:
    _exchange(fingerprint=8)


def case_exchange_same_gpu() -> str:
    _exchange(bus_of_rank2="gpu-0")


def case_exchange_never() -> str:
    _exchange(publish=PROCESS == 0, everyone_reports=False)


def case_exchange_exits() -> str:
    if PROCESS == 1:
        jaxcoll.distributed.connect()
        os._exit(0)
    _exchange(everyone_reports=False)


if __name__ == "__main__":
    name = sys.argv[1]
    result = globals()[f"case_{name}"]()
    print("ok", name, result, flush=True)
    jax.distributed.shutdown()
