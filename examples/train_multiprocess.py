"""Data-parallel + tensor-parallel training across the processes of a jax.distributed job on jaxcoll's
collectives: the same loss curve as the same training run in one process.

The model is a stack of residual MLP blocks, Megatron-style over mesh axis "model": each block's up projection
is column-parallel (w1's columns, b1 split over ranks) and its down projection row-parallel (w2's rows split),
so the block's output is a partial sum that `jaxcoll.all_reduce` over "model" completes (Megatron's g: all_reduce
forward, identity backward), and the block's input enters through Megatron's f (identity forward, all_reduce of
the input gradient backward). The batch is split over mesh axis "data"; each rank differentiates its share of
the loss, and the gradients are summed with `jaxcoll.all_reduce` over "data", one call per bucket of gradients
(as DDP buckets them). Forward, backward and the gradient sum all run inside one `jax.jit(jax.shard_map(...))`;
Adam (optax) updates each rank's shard of the parameters in the surrounding jit, elementwise, with no
collective. The task is synthetic: fit a fixed random tanh network on fresh Gaussian inputs each step.

`python examples/train_multiprocess.py --processes 2 --steps 200` runs two jobs with jaxcoll.launch: the
training on a mesh of 2 processes x 4 CPU devices, then the same training in one process with 8 CPU devices on
the same mesh, plus an unsharded reference (the same model and data on one device, plain jnp, no collective).
It prints the loss curves side by side and the largest differences; `--collectives jaxcoll lax` also trains
with jax.lax's collectives (XLA's gloo across processes), `--out losses.png` draws the curves.

Tolerance: every loss curve equals every other within RTOL = 1e-5, relative, at each step: the job against the
single-process run with the same collectives, jaxcoll against jax.lax, and each against the unsharded reference.
Each rank runs the same XLA program in every layout, on the same data, so the curves can differ only by the order in
which sums are added: a collective over a group that spans processes may order its terms otherwise (jaxcoll's
hierarchical plans reduce within each process first), and against the unsharded model the products themselves are
split (u @ w2 is one partial sum per rank of "model", added by the all_reduce; the batch's loss one partial mean per
rank of "data"). Each reordering moves a float32 result by an ulp or so (6e-8 relative), and the training does not
amplify it: measured, the job equals the single-process run bitwise on meshes 2x4 (2 processes) and 4x2 (4) and
within 3.7e-7 on mesh 2x4 over 4 processes ("model" sums reordered too), and every curve is within 1.2e-6 of the
unsharded one, over 1000 steps. A wrong sum moves the loss by percents within a few steps.

Processes x devices: 2 x 4 (mesh 2x4: "data" across the 2 processes, "model" inside each) and 4 x 2 (mesh 4x2,
the same arrangement; `--mesh 2x4` on 4 processes runs "model" across process pairs as well).

    python examples/train_multiprocess.py [--processes 2] [--steps 200] [--mesh DxM] [--collectives jaxcoll lax]
                                          [--out PNG]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcoll
import jaxcoll.launch

DATA, MODEL = "data", "model"
DEVICES = 8  # in every job: processes x devices per process
RTOL = 1e-5  # on each step's loss, relative; the module docstring says why
XLA_COLLECTIVE = re.compile(r"\b(all-gather|reduce-scatter|all-reduce|collective-permute|all-to-all)(-start)?\(")


def block_specs():
    return {"scale": P(), "w1": P(None, MODEL), "b1": P(MODEL), "w2": P(MODEL, None), "b2": P()}


# -- the collectives: jaxcoll's, jax.lax's, or none (the unsharded reference) ----------------------------------

class Collectives:
    """The sums the training step needs, from jaxcoll or from jax.lax; "none" runs the same model unsharded."""

    def __init__(self, kind: str):
        if kind not in ("jaxcoll", "lax", "none"):
            raise ValueError(f"Collectives: kind must be 'jaxcoll', 'lax' or 'none', got kind={kind!r}")
        self.kind = kind
        self.enter = self._megatron_f()

    def sum(self, x, axis):
        if self.kind == "jaxcoll":
            return jaxcoll.all_reduce(x, axis)
        if self.kind == "lax":
            return lax.psum(x, axis)
        return x

    def vary(self, x, axis):
        return x if self.kind == "none" else lax.pcast(x, axis, to="varying")

    def _megatron_f(self):
        # Written out rather than left to shard_map's implicit pvary, whose transpose is always lax.psum: this
        # keeps the backward all_reduce on the collectives chosen.
        @jax.custom_vjp
        def enter(x):
            return self.vary(x, MODEL)

        def fwd(x):
            return enter(x), None

        def bwd(_, ct):
            return (self.sum(ct, MODEL),)

        enter.defvjp(fwd, bwd)
        return enter


# -- the model -------------------------------------------------------------------------------------------------

def rmsnorm(x, scale, eps=1e-6):
    return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * scale


def block(p, x, ops: Collectives):
    """x: (batch, hidden), the same on every rank of "model"; returns x + MLP(norm(x)), the same on every rank."""
    h = ops.enter(rmsnorm(x, p["scale"]))                     # f: identity, all_reduce of the gradient
    u = jax.nn.gelu(h @ p["w1"] + p["b1"])                     # column-parallel: this rank's ffn/m columns
    return x + ops.sum(u @ p["w2"], MODEL) + p["b2"]           # row-parallel, completed by g: all_reduce


def local_loss(params, x, y, ops: Collectives, global_batch: int):
    """This rank's share of the batch's mean squared error: summed over "data", the loss of the whole batch."""
    for p in params:
        x = block(p, x, ops)
    return jnp.sum((x - y) ** 2) / (global_batch * y.shape[-1])


def init_params(seed: int, layers: int, hidden: int, ffn: int):
    rng = np.random.default_rng([seed, 0])
    n = lambda shape, fan_in: (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return [{"scale": np.ones(hidden, np.float32), "w1": n((hidden, ffn), hidden), "b1": np.zeros(ffn, np.float32),
             "w2": n((ffn, hidden), ffn) * np.float32(0.5), "b2": np.zeros(hidden, np.float32)}
            for _ in range(layers)]


def batch(seed: int, step: int, batch_size: int, hidden: int):
    """Step `step`'s inputs and targets, the same in every process: the target is a fixed random tanh network."""
    teacher = np.random.default_rng([seed, 1])
    a = teacher.standard_normal((hidden, hidden)) / np.sqrt(hidden)
    b = teacher.standard_normal((hidden, hidden)) / np.sqrt(hidden)
    x = np.random.default_rng([seed, 2, step]).standard_normal((batch_size, hidden))
    return x.astype(np.float32), (np.tanh(2 * x @ a) @ b).astype(np.float32)


# -- the training step -----------------------------------------------------------------------------------------

def make_step(mesh: Mesh, kind: str, layers: int, global_batch: int, lr: float):
    ops = Collectives(kind)
    specs = [block_specs()] * layers
    tx = optax.adam(lr)

    def loss_and_grads(params, x, y):
        # Varying over "data" before differentiating: otherwise shard_map's implicit pvary of the replicated
        # parameters would transpose to a lax.psum of the gradients, outside the collectives chosen.
        params = ops.vary(params, DATA)
        loss, g = jax.value_and_grad(local_loss)(params, x, y, ops, global_batch)
        # One all_reduce per bucket: the sharded parameters' gradients (varying over "model") and the
        # replicated ones' (the same on every rank of "model"), each flattened into one buffer.
        g = sum_buckets(g, specs, lambda v: ops.sum(v, DATA))
        return ops.sum(loss, DATA), g

    grads = jax.shard_map(loss_and_grads, mesh=mesh, in_specs=(specs, P(DATA), P(DATA)), out_specs=(P(), specs))

    @jax.jit
    def step(params, opt_state, x, y):
        loss, g = grads(params, x, y)
        updates, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, jax.jit(tx.init)


def sum_buckets(tree, specs, total):
    """`total` applied to the leaves of `tree` as two flat buffers: those whose spec names an axis, and the rest."""
    leaves, treedef = jax.tree.flatten(tree)
    sharded = [s != P() for s in jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))]
    out = list(leaves)
    for want in (True, False):
        at = [i for i, s in enumerate(sharded) if s == want]
        if not at:
            continue
        flat = total(jnp.concatenate([leaves[i].ravel() for i in at]))
        offsets = np.cumsum([0] + [leaves[i].size for i in at])
        for k, i in enumerate(at):
            out[i] = flat[offsets[k]:offsets[k + 1]].reshape(leaves[i].shape)
    return jax.tree.unflatten(treedef, out)


def put(mesh: Mesh, spec, value: np.ndarray):
    """The global array `value` laid out by `spec`; every process holds all of it and gives its shards."""
    return jax.make_array_from_callback(value.shape, NamedSharding(mesh, spec), lambda index: value[index])


def train(mesh: Mesh, kind: str, steps: int, *, layers=2, hidden=32, ffn=128, batch_size=64, lr=3e-3, seed=0):
    """Loss per step (float32 values), median seconds per step after the first, and the compiled step's text."""
    specs = [block_specs()] * layers
    params = [{name: put(mesh, s[name], w) for name, w in p.items()}
              for p, s in zip(init_params(seed, layers, hidden, ffn), specs)]
    step, init = make_step(mesh, kind, layers, batch_size, lr)
    opt_state = init(params)
    losses, times, compiled = [], [], None
    for i in range(steps):
        x, y = (put(mesh, P(DATA), a) for a in batch(seed, i, batch_size, hidden))
        if compiled is None:
            compiled = step.lower(params, opt_state, x, y).compile().as_text()
        t0 = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, x, y)
        losses.append(float(loss.addressable_data(0)))
        times.append(time.perf_counter() - t0)
    seconds = float(np.median(times[1:])) if steps > 1 else float("nan")
    return np.array(losses, np.float32), seconds, compiled


def train_unsharded(steps: int, *, layers=2, hidden=32, ffn=128, batch_size=64, lr=3e-3, seed=0):
    """The reference: the same model, data and optimizer on one device, whole arrays, no collective."""
    ops, tx = Collectives("none"), optax.adam(lr)
    params = jax.tree.map(jnp.asarray, init_params(seed, layers, hidden, ffn))

    @jax.jit
    def step(params, opt_state, x, y):
        loss, g = jax.value_and_grad(local_loss)(params, x, y, ops, batch_size)
        updates, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state, losses = tx.init(params), []
    for i in range(steps):
        params, opt_state, loss = step(params, opt_state, *batch(seed, i, batch_size, hidden))
        losses.append(float(loss))
    return np.array(losses, np.float32)


# -- one process of a job ---------------------------------------------------------------------------------------

def job_mesh(shape: tuple[int, int]) -> Mesh:
    """Every process's devices, process by process, as a (data, model) grid, row-major. The default shape
    (processes, devices per process) gives each process one row: "data" runs across the processes, "model" stays
    inside each, as Megatron places tensor parallelism where the links are fastest. A shape with longer rows
    (2x4 over 4 processes) makes each "model" group span processes too."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devices).reshape(shape), (DATA, MODEL))


def crossing_axes(mesh: Mesh) -> list[str]:
    """The mesh axes whose groups span processes."""
    first_group = {DATA: mesh.devices[:, 0], MODEL: mesh.devices[0, :]}
    return [a for a in (DATA, MODEL) if len({d.process_index for d in first_group[a]}) > 1]


def run_process(args) -> None:
    """In a process started by launch: join the job, train, print one `result` line per kind of collectives."""
    process, nprocesses = jaxcoll.launch.initialize()
    mesh = job_mesh(args.mesh)
    crossing = crossing_axes(mesh)
    for kind in args.collectives:
        losses, seconds, compiled = train(mesh, kind, args.steps)
        print("result", json.dumps({"process": process, "processes": nprocesses, "kind": kind,
                                    "losses": [float(v) for v in losses], "step_ms": seconds * 1e3,
                                    "crossing": crossing, "xla_collectives": len(XLA_COLLECTIVE.findall(compiled)),
                                    "jaxcoll_calls": compiled.count('custom_call_target="jaxcoll_')}), flush=True)
    if args.reference and process == 0:
        print("result", json.dumps({"process": 0, "processes": nprocesses, "kind": "unsharded",
                                    "losses": [float(v) for v in train_unsharded(args.steps)]}), flush=True)
    jax.distributed.shutdown()


# -- the driver: launch the jobs, compare ----------------------------------------------------------------------

def run_job(processes: int, mesh: tuple[int, int], kinds, steps: int, *, reference=False,
            timeout_s: float = 600.0) -> dict:
    """Launch `processes` processes of DEVICES // processes CPU devices each and train with every kind of
    collectives in `kinds`. Returns {kind: result} (process 0's), after checking that every process exited
    cleanly and reported bitwise the same losses (the loss is replicated: every rank holds the same value)."""
    if DEVICES % processes:
        raise ValueError(f"run_job: processes must divide {DEVICES}, got processes={processes}")
    argv = [__file__, "--steps", str(steps), "--mesh", f"{mesh[0]}x{mesh[1]}", "--collectives", *kinds]
    results = jaxcoll.launch.launch(processes, argv + (["--reference"] if reference else []),
                                    local_devices=DEVICES // processes, timeout_s=timeout_s)
    by_process = []
    for r in results:
        if r.returncode != 0:
            raise RuntimeError(f"process {r.process} of {processes} exited with {r.returncode}:\n"
                               f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        by_process.append({d["kind"]: d for d in (json.loads(line.split(" ", 1)[1])
                                                  for line in r.stdout.splitlines() if line.startswith("result "))})
    for p, got in enumerate(by_process[1:], 1):
        for kind in kinds:
            if got[kind]["losses"] != by_process[0][kind]["losses"]:
                raise RuntimeError(f"process {p} reported other {kind} losses than process 0")
    return by_process[0]


def difference(a, b) -> tuple[float, float]:
    """Largest absolute and relative difference of loss curve a from b."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b))), float(np.max(np.abs(a - b) / np.abs(b)))


def parse_mesh(text: str) -> tuple[int, int]:
    try:
        data, model = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mesh must read DATAxMODEL, as in 2x4, got {text!r}") from None
    if data * model != DEVICES:
        raise argparse.ArgumentTypeError(f"--mesh must have {DEVICES} devices, got {text!r}")
    return data, model


def main(argv=None) -> bool:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=2, choices=(2, 4))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--mesh", type=parse_mesh, default=None,
                    help="DATAxMODEL, default: processes x (8 / processes), 'data' across the processes")
    ap.add_argument("--collectives", nargs="+", choices=("jaxcoll", "lax"), default=["jaxcoll"])
    ap.add_argument("--out", metavar="PNG", default=None, help="also plot the loss curves to this file")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds each job may take")
    ap.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)  # set by the driver
    args = ap.parse_args(argv)
    if args.mesh is None:
        args.mesh = (args.processes, DEVICES // args.processes)
    if jaxcoll.launch.in_job():
        run_process(args)
        return True

    kinds = list(dict.fromkeys(args.collectives))
    t0 = time.perf_counter()
    job = run_job(args.processes, args.mesh, kinds, args.steps, timeout_s=args.timeout)
    t1 = time.perf_counter()
    single = run_job(1, args.mesh, kinds, args.steps, reference=True, timeout_s=args.timeout)
    t2 = time.perf_counter()
    curves = {f"{args.processes} processes, {k}": job[k]["losses"] for k in kinds}
    curves.update({f"1 process, {k}": single[k]["losses"] for k in kinds})
    curves["unsharded"] = single["unsharded"]["losses"]

    d, m = args.mesh
    print(f"data x model = {d}x{m} mesh, {args.steps} steps; across processes: "
          f"{', '.join(job[kinds[0]]['crossing']) or 'none'}")
    names = list(curves)
    print("step  " + "  ".join(f"{n:>22}" for n in names))
    for i in range(args.steps):
        print(f"{i:4d}  " + "  ".join(f"{curves[n][i]:22.7f}" for n in names))

    ok = True
    print(f"\n{'compared':<48} {'max abs diff':>12} {'max rel diff':>12}   (tolerance: {RTOL:.0e} relative)")
    comparisons = [(f"{args.processes} processes, {k}", f"1 process, {k}") for k in kinds]
    comparisons += [(n, "unsharded") for n in names if n != "unsharded"]
    if len(kinds) > 1:
        comparisons.append((f"{args.processes} processes, lax", f"{args.processes} processes, jaxcoll"))
    for a, b in comparisons:
        abs_diff, rel_diff = difference(curves[a], curves[b])
        ok &= rel_diff <= RTOL
        print(f"{a + ' vs ' + b:<48} {abs_diff:12.3e} {rel_diff:12.3e}{'' if rel_diff <= RTOL else '  OVER'}")
    for k in kinds:
        print(f"{k}: step time (median after the first) {job[k]['step_ms']:.2f} ms across {args.processes} "
              f"processes, {single[k]['step_ms']:.2f} ms in one; XLA collectives in the compiled step: "
              f"{job[k]['xla_collectives']}, jaxcoll custom calls: {job[k]['jaxcoll_calls']}")
    print(f"wall time: job {t1 - t0:.1f} s, single process {t2 - t1:.1f} s; "
          f"loss {curves[names[0]][0]:.4f} -> {curves[names[0]][-1]:.4f}")
    print("every curve within the tolerance" if ok else "a curve is OVER the tolerance")
    if args.out:
        plot(curves, args.out)
    return ok


def plot(curves: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for i, (name, losses) in enumerate(curves.items()):
        top.plot(losses, label=name, linestyle=("-", "--", ":", "-.")[i % 4])
    top.set_yscale("log")
    top.set_ylabel("loss")
    top.legend()
    ref = np.asarray(curves["unsharded"], np.float64)
    for name, losses in curves.items():
        if name != "unsharded":
            bottom.plot(np.abs(np.asarray(losses, np.float64) - ref) / ref, label=f"{name} vs unsharded")
    bottom.set_yscale("symlog", linthresh=1e-9)
    bottom.set_xlabel("step")
    bottom.set_ylabel("relative difference")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
