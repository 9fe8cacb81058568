"""CUDA executor benchmark on ONE GPU: issue 14's three speed targets, side by side in one run. Prints markdown
tables (tools/gpu_round.sh collects them into bench.md; they go to docs/benchmarks.md with the GPU model).

    PYTHONPATH=. python benchmarks/cuda.py [--device 0] [--iters 20] [--ranks 8] [--parts bulk,packet,fused]
                                           [--quick]

Parts:
- bulk: the bulk protocol, every rank of an 8-rank group emulated on the device. all_reduce (two_shot, ring)
  with 256 MiB in and out per rank, all_gather (direct, ring) gathering 256 MiB per rank (32 MiB in at 8 ranks,
  the nccl-tests convention). "traffic" is the bytes every data step of every rank reads and writes per call
  (computed from the plan) divided by the time; a device-to-device cudaMemcpy of 256 MiB measured in the same
  run moves twice its bytes copied (each byte read once, written once). Goal: traffic >= 85 % of the copy's.
- packet: the packet (LL) protocol: microseconds per call, back-to-back launches and one CUDA graph replaying all
  calls, for issue 27's goals: the direct all_reduce of 8 KiB per rank at 8 ranks (<= 7 us back to back, <= 5 us
  replayed) and at 2 ranks (<= 4 us), of 64 KiB at 8 ranks (<= 10 us), and the direct all_gather and
  reduce_scatter of 8 KiB (the nccl-tests convention: the larger buffer; <= 5 us); the ring all_reduce without a
  goal. Then the kernel's variants on the 8-rank 8 KiB all_reduce, replayed: blocks per lane, the scope of the
  synchronisation words, and the packet polls one source at a time or all in flight, as tools/gpu_floor.cu's
  floor table varies them.
- fused: on the one-GPU mesh, all_gather_matmul and matmul_reduce_scatter (jaxcoll.fused) against one plain
  jnp.dot of the same shapes, timed in shuffled rounds in the same process. "of GEMM" is the median over rounds
  of dot time / fused time. Goal: >= 90 %, for the rows whose one-rank collective is lowered as jaxcoll lowers it
  (no custom call); the rows with the collective forced through the executor add a copy of the block (the
  collective's cost, which one GPU cannot overlap with anything) and carry no goal.

- tune: the cost model's tune step (docs/tuning.md, "GPU"): the CUDA executor's model (jaxcoll.sim.gpu: the
  lanes' critical path, each lane at its blocks' rate), fitted to shifts and the simplest plans of each collective
  on the emulated ranks (separately for packets and bulk, the protocol auto takes at each size), then the
  predicted and measured times of every built-in and synthesized plan side by side, apart for the plans and sizes
  the fit saw and did not. Not in the default parts (the GPU round runs it as a step of its own). With
  --measured TUNE_MD it refits and checks the model on the times an earlier run printed, without a GPU.

--quick shrinks every size and count (a smoke test of the program: its numbers mean nothing). The timing source
is an argument of main(), so tests/test_bench_cuda.py checks the argument handling and the tables without a GPU.
"""

from __future__ import annotations

import argparse
import subprocess
from dataclasses import dataclass
from typing import Callable

import numpy as np

from jaxcoll import algorithms, runtime
from jaxcoll.plan import Collective, Plan, encode

MiB = 1 << 20
KiB = 1 << 10
PARTS = ("bulk", "packet", "fused", "tune")
DEFAULT_PARTS = ("bulk", "packet", "fused")
# Issue 14's goals.
BULK_GOAL = 0.85  # of the device-to-device copy's traffic
FUSED_GOAL = 0.90  # of the plain GEMM's rate


@dataclass(frozen=True)
class Sizes:
    """What each part moves or multiplies: the issue's sizes, or --quick's."""
    bulk_bytes: int = 256 * MiB  # a rank's larger buffer; also the reference copy
    packet_bytes: int = 8 * KiB
    packet_iters: int = 200  # at least: per-call times of a few microseconds need many calls
    gemm: tuple[int, int, int] = (8192, 8192, 8192)  # M, K, N
    gemm_dtype: str = "bfloat16"
    chunks: tuple[int, ...] = (1, 4)
    rounds: int = 10
    tune_bytes: tuple[int, ...] = (8 * KiB, 256 * KiB, 4 * MiB, 64 * MiB)  # per-rank input


QUICK = Sizes(bulk_bytes=1 * MiB, packet_iters=4, gemm=(256, 128, 64), chunks=(1, 2), rounds=2,
              tune_bytes=(8 * KiB, 256 * KiB))


# ---------------------------------------------------------------------------------------------------------------
# Timing sources
# ---------------------------------------------------------------------------------------------------------------
class CudaTimer:
    """Times on the GPU: the emulated harness's device timing (CUDA events) and JAX programs on `device`."""

    def __init__(self, device: int):
        self.index = device

    @property
    def device(self):
        """jax's device of the same index (asked only by the fused part: the others need no JAX backend)."""
        import jax
        return jax.devices("cuda")[self.index]

    def name(self) -> str:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", f"--id={self.index}"],
                                 capture_output=True, text=True, timeout=30)
            return out.stdout.strip() or "unknown GPU"
        except (OSError, subprocess.TimeoutExpired):
            return "unknown GPU"

    def copy_bandwidth(self, nbytes: int, iters: int) -> float:
        """Bytes copied per second by one device-to-device cudaMemcpy of `nbytes` (best of `iters`)."""
        return runtime._jaxcoll.cuda_memcpy_bandwidth(nbytes, iters, self.index)

    def plan(self, plan: Plan, input_elements: int, output_elements: int, *, iters: int, graph: bool,
             protocol: str, blocks: int = 0, poll: str = "", scope: str = "") -> dict:
        """{seconds_per_call, protocol, blocks_per_lane, traffic_bytes} of float32 calls of `plan`; `blocks`,
        `poll` and `scope` pick the kernel's variants (0 and '': the executor's own choice)."""
        return runtime._jaxcoll.cuda_time(encode(plan), "float32", input_elements, output_elements, 0, iters, graph,
                                          protocol, blocks, self.index, poll=poll, scope=scope)

    def rounds(self, fns: dict[str, Callable], args: tuple, rounds: int) -> dict[str, np.ndarray]:
        """Per-round seconds of each fn: every round runs each fn once, in a shuffled order, so machine noise hits
        them alike and a ratio can be taken within a round (benchmarks/fused.py's `measure`)."""
        from fused import measure  # benchmarks/ is the script's own folder
        return measure(fns, args, rounds)


# ---------------------------------------------------------------------------------------------------------------
# The parts
# ---------------------------------------------------------------------------------------------------------------
def size_label(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def goal_cell(met: bool) -> str:
    return "met" if met else "**missed**"


def bulk_table(timer, n: int, sizes: Sizes, iters: int) -> list[str]:
    copy_bw = timer.copy_bandwidth(sizes.bulk_bytes, iters)
    copy_traffic = 2 * copy_bw
    lines = [f"Device-to-device cudaMemcpy of {size_label(sizes.bulk_bytes)}: {copy_bw / 1e9:.1f} GB/s copied "
             f"({copy_traffic / 1e9:.1f} GB/s of traffic).", "",
             f"| collective | algorithm | protocol | per rank | blocks/lane | time | traffic GB/s | of copy "
             f"| goal >= {BULK_GOAL:.0%} |",
             "|---|---|---|---|---|---|---|---|---|"]
    for collective, name in ((Collective.ALL_REDUCE, "two_shot"), (Collective.ALL_REDUCE, "ring"),
                             (Collective.ALL_GATHER, "direct"), (Collective.ALL_GATHER, "ring")):
        plan = algorithms.builtin(collective, name, n)
        ins, outs = plan.elements_for_bytes(sizes.bulk_bytes, 4)
        r = timer.plan(plan, ins, outs, iters=iters, graph=False, protocol="bulk")
        traffic = r["traffic_bytes"] / r["seconds_per_call"]
        share = traffic / copy_traffic
        per_rank = f"{size_label(ins * 4)} in, {size_label(outs * 4)} out"
        lines.append(f"| {collective.value} | {name} | {r['protocol']} | {per_rank} | {r['blocks_per_lane']} | "
                     f"{r['seconds_per_call'] * 1e3:.2f} ms | {traffic / 1e9:.1f} | {share:.0%} | "
                     f"{goal_cell(share >= BULK_GOAL)} |")
    return lines


@dataclass(frozen=True)
class PacketRow:
    """One row of the packet part: a built-in plan at `ranks`, `nbytes` in its larger buffer per rank, and issue
    27's goals in seconds per call (None: no goal)."""
    collective: Collective
    algorithm: str
    ranks: int  # 0: the benchmark's --ranks
    nbytes: int
    back_to_back_goal: float | None
    replay_goal: float | None


PACKET_ROWS = (
    PacketRow(Collective.ALL_REDUCE, "direct", 0, 8 * KiB, 7e-6, 5e-6),
    PacketRow(Collective.ALL_REDUCE, "direct", 2, 8 * KiB, None, 4e-6),
    PacketRow(Collective.ALL_REDUCE, "direct", 0, 64 * KiB, None, 10e-6),
    PacketRow(Collective.ALL_GATHER, "direct", 0, 8 * KiB, None, 5e-6),
    PacketRow(Collective.REDUCE_SCATTER, "direct", 0, 8 * KiB, None, 5e-6),
    PacketRow(Collective.ALL_REDUCE, "ring", 0, 8 * KiB, None, None),
)
# The variants timed on the first row (tools/gpu_floor.cu's axes): blocks per lane, word scope, polls.
PACKET_VARIANTS = tuple((b, scope, poll) for poll in ("in_order", "in_flight") for scope in ("system", "narrowest")
                        for b in (1, 2, 4, 8))


def packet_goal(t: float | None, goal: float | None) -> str:
    if goal is None or t is None:
        return "-"
    return f"<= {goal * 1e6:g} us: {goal_cell(t <= goal)}"


def packet_time(timer, plan: Plan, ins: int, outs: int, iters: int, graph: bool,
                **variant) -> tuple[float | None, str, int]:
    """(seconds or None, the cell, blocks per lane) of one timing; a failure (e.g. a driver that cannot capture
    cooperative launches) is a cell that says so, and the table goes on."""
    try:
        r = timer.plan(plan, ins, outs, iters=iters, graph=graph, protocol="ll", **variant)
    except RuntimeError as e:
        return None, f"failed: {e}".replace("|", "/").replace("\n", " "), 0
    return r["seconds_per_call"], f"{r['seconds_per_call'] * 1e6:.1f} us", r["blocks_per_lane"]


def packet_table(timer, n: int, sizes: Sizes, iters: int) -> list[str]:
    iters = max(iters, sizes.packet_iters)
    lines = ["| collective | algorithm | ranks | per rank | blocks/lane | back to back | goal | graph replay | goal |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in PACKET_ROWS:
        ranks = row.ranks or n
        plan = algorithms.builtin(row.collective, row.algorithm, ranks)
        nbytes = sizes.packet_bytes * row.nbytes // (8 * KiB)
        ins, outs = plan.elements_for_bytes(nbytes, 4)
        b2b, b2b_cell, blocks = packet_time(timer, plan, ins, outs, iters, False)
        replay, replay_cell, _ = packet_time(timer, plan, ins, outs, iters, True)
        per_rank = (size_label(ins * 4) if ins == outs else f"{size_label(ins * 4)} in, {size_label(outs * 4)} out")
        lines.append(f"| {row.collective.value} | {row.algorithm} | {ranks} | {per_rank} | {blocks or '-'} | "
                     f"{b2b_cell} | {packet_goal(b2b, row.back_to_back_goal)} | {replay_cell} | "
                     f"{packet_goal(replay, row.replay_goal)} |")
    first = PACKET_ROWS[0]
    plan = algorithms.builtin(first.collective, first.algorithm, n)
    ins, outs = plan.elements_for_bytes(sizes.packet_bytes, 4)
    lines += ["", f"The kernel's variants, {first.collective.value} {first.algorithm} at {n} ranks, "
                  f"{size_label(sizes.packet_bytes)} per rank, CUDA graph replay:", "",
              "| blocks per lane | counters | packet polls | graph replay |", "|---|---|---|---|"]
    for blocks, scope, poll in PACKET_VARIANTS:
        _, cell, _ = packet_time(timer, plan, ins, outs, iters, True, blocks=blocks, poll=poll, scope=scope)
        lines.append(f"| {blocks} | {'system scope' if scope == 'system' else 'narrowest scope'} | "
                     f"{'one source at a time' if poll == 'in_order' else 'all in flight'} | {cell} |")
    return lines


# How a one-rank group's collective is lowered in the fused rows: as jaxcoll lowers it for users (no custom call,
# the identity), and forced through the executor (a copy of the block: the collective's cost, not the matmul's).
LOWERINGS = {"identity": "none (as lowered)", "executor": "executor (forced)"}


def fused_programs(device, sizes: Sizes):
    """{(op, chunks, lowering): (variants, args, flops)}: each fused op and chunk count, lowered both ways, and one
    plain jnp.dot of the same shapes, as jitted functions of (x, w) on a one-device mesh of `device`. jit lowers
    at the first call: fused_table sets the lowering then."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxcoll import fused

    m, k, n = sizes.gemm
    mesh = jax.make_mesh((1,), ("i",), devices=[device])
    rng = np.random.default_rng(0)
    dtype = jnp.dtype(sizes.gemm_dtype)
    x = jax.device_put(rng.standard_normal((m, k), np.float32).astype(dtype), NamedSharding(mesh, P("i")))
    w = jax.device_put(rng.standard_normal((k, n), np.float32).astype(dtype), NamedSharding(mesh, P()))
    dot = jax.jit(jnp.dot)
    ops = {"all_gather_matmul": lambda c: (lambda x, w: fused.all_gather_matmul(x, w, "i", chunks=c)),
           "matmul_reduce_scatter": lambda c: (lambda x, w: fused.matmul_reduce_scatter(x, w, "i", chunks=c))}
    out = {}
    for op, make in ops.items():
        for c in sizes.chunks:
            for lowering in LOWERINGS:
                f = jax.jit(jax.shard_map(make(c), mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i")))
                out[(op, c, lowering)] = ({"fused": f, "dot": dot}, (x, w), 2 * m * k * n)
    return out


def fused_table(timer, sizes: Sizes) -> list[str]:
    from jaxcoll.lowering import custom_call

    m, k, n = sizes.gemm
    lines = [f"| op | dtype | M x K x N | chunks | one-rank collective | fused | jnp.dot | fused TFLOP/s | of GEMM "
             f"| goal >= {FUSED_GOAL:.0%} |", "|---|---|---|---|---|---|---|---|---|---|"]
    try:
        device = timer.device
    except (RuntimeError, IndexError) as e:  # jaxcoll's executor runs, but jax has no such CUDA device
        return lines + [f"| jax has no CUDA device here: {e} |".replace("\n", " ")]
    for (op, chunks, lowering), (fns, args, flops) in fused_programs(device, sizes).items():
        forced = lowering == "executor"
        custom_call.lower_single_rank_groups = forced
        try:
            # The op must compute the product it is timed against (bf16 products of normal numbers: loose).
            np.testing.assert_allclose(np.asarray(fns["fused"](*args), np.float32),
                                       np.asarray(fns["dot"](*args), np.float32), rtol=5e-2,
                                       atol=5e-2 * np.sqrt(k), err_msg=f"{op} (chunks={chunks}) and jnp.dot differ")
        finally:
            custom_call.lower_single_rank_groups = False
        t = timer.rounds(fns, args, sizes.rounds)
        fused_s, dot_s = float(np.median(t["fused"])), float(np.median(t["dot"]))
        share = float(np.median(t["dot"] / t["fused"]))
        # The goal is the matmul's: the forced rows add a copy of the block no user's program runs.
        goal = "-" if forced else goal_cell(share >= FUSED_GOAL)
        lines.append(f"| {op} | {sizes.gemm_dtype} | {m} x {k} x {n} | {chunks} | {LOWERINGS[lowering]} | "
                     f"{fused_s * 1e3:.3f} ms | {dot_s * 1e3:.3f} ms | {flops / fused_s / 1e12:.1f} | {share:.0%} | "
                     f"{goal} |")
    return lines


# ---------------------------------------------------------------------------------------------------------------
# The program
# ---------------------------------------------------------------------------------------------------------------
# The plans the GPU model is fitted to beside the shifts: jaxcoll.tune.calibration's, and the built-in ring, whose
# chain of signals and waits prices a sync step and a signal's way (no other training plan has either).
GPU_TRAINING = (("all_reduce", "direct"), ("all_reduce", "two_shot"), ("all_gather", "direct"),
                ("reduce_scatter", "direct"), ("all_reduce", "ring"))


def signal_train(n: int, signals: int = 64) -> Plan:
    """The shift of jaxcoll.tune.calibration, then `signals` signals to the next rank and as many waits for the
    previous rank's: the waits find their signals landed, so the train prices a sync step alone, where a ring's
    hops price two sync steps and a signal's way each."""
    from jaxcoll.plan import Lane, Op, RankProgram, Step
    from jaxcoll.tune import calibration
    base = calibration.shift_plan((0,) * n, False)
    programs = []
    for r, prog in enumerate(base.ranks):
        steps = (prog.lanes[0].steps + (Step(Op.SIGNAL, peer=(r + 1) % n, sem=0),) * signals
                 + (Step(Op.WAIT, sem=0),) * signals)
        programs.append(RankProgram(prog.input_chunks, prog.output_chunks, semaphores=1, lanes=(Lane(steps),)))
    return Plan(base.collective, n, tuple(programs), name=f"probe-signals-{signals}", perm=base.perm)


def tune_cells(n: int, sizes: Sizes):
    """(plan name, plan, per-rank input bytes, fitted?) of the tune part: the training set of
    jaxcoll.tune.calibration (shifts; the direct and two-shot all_reduce, the direct all_gather and
    reduce_scatter) at every size, then every other built-in and synthesized plan of the three collectives."""
    from jaxcoll.tune import calibration, registry
    ranks = (0,) * n
    shifts = {"shift": calibration.shift_plan(ranks, False),
              "shift x8": calibration.shift_plan(ranks, False, repeats=calibration.REPEATS),
              "shift in 1024 puts": calibration.shift_plan(ranks, False, calibration.STEP_CHUNKS),
              "shift, 64 signals": signal_train(n)}
    fitted = {f"{c}.{name}" for c, name in GPU_TRAINING}
    cells = []
    for nbytes in sizes.tune_bytes:
        for name, plan in shifts.items():
            cells.append((name, plan, nbytes, True))
        for collective in ("all_reduce", "all_gather", "reduce_scatter"):
            for name, plan in registry.candidates(collective, n).items():
                key = f"{collective}.{name}"
                cells.append((key, plan, nbytes, key in fitted))
    return cells


def cell_elements(plan: Plan, nbytes: int) -> int:
    """Float32 input elements a rank of a tune cell of `nbytes` a rank: whole blocks of the plan, one at least."""
    return max(plan.in_blocks, nbytes // 4 // plan.in_blocks * plan.in_blocks)


def measure_cells(timer, n: int, sizes: Sizes, iters: int) -> list[tuple]:
    """(name, plan, per-rank input bytes, fitted?, protocol, seconds) of every tune cell, timed as a CUDA graph
    with the protocol auto takes (packets up to 64 KiB a rank)."""
    out = []
    for name, plan, nbytes, fitted in tune_cells(n, sizes):
        ins = cell_elements(plan, nbytes)
        outs = ins // plan.in_blocks * plan.out_blocks
        r = timer.plan(plan, ins, outs, iters=iters, graph=True, protocol="auto")
        out.append((name, plan, ins * 4, fitted, r["protocol"], r["seconds_per_call"]))
    return out


def recorded_cells(path: str, n: int, sizes: Sizes) -> list[tuple]:
    """The cells of `tune_cells`, with the protocol and time an earlier run of this part printed in `path` (its
    table of predicted and measured times): the model is refitted and checked without a GPU. Cells the recording
    lacks (it predates them) are left out and named."""
    times = {}
    for line in open(path, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[2] in ("ll", "bulk"):
            times[cells[0], cells[1]] = (cells[2], float(cells[4]) * 1e-6)
    out, missing = [], []
    for name, plan, nbytes, fitted in tune_cells(n, sizes):
        ins = cell_elements(plan, nbytes)
        key = (name, size_label(nbytes))
        if key in times:
            out.append((name, plan, ins * 4, fitted, *times[key]))
        else:
            missing.append(f"{name} at {key[1]}")
    if not out:
        raise SystemExit(f"--measured {path}: no time for any cell of a tune part of {n} ranks at "
                         f"{', '.join(size_label(b) for b in sizes.tune_bytes)} a rank")
    if missing:
        print(f"Not in the recording, left out: {', '.join(missing)}.\n")
    return out


def tune_table(timer, n: int, sizes: Sizes, iters: int, measured: list[tuple] | None = None) -> list[str]:
    from jaxcoll.sim import gpu

    measured = measured if measured is not None else measure_cells(timer, n, sizes, iters)
    models = {}
    for protocol in sorted({m[4] for m in measured}):
        train = [m for m in measured if m[4] == protocol and m[3]]
        models[protocol] = gpu.fit(gpu.GpuModel(), [(m[1], m[2], protocol) for m in train],
                                   [m[5] for m in train]) if train else gpu.GpuModel()
    lines = [f"The CUDA executor's model (jaxcoll.sim.gpu: the lanes' critical path) fitted per protocol on the "
             f"shifts and {', '.join(c + ' ' + a for c, a in GPU_TRAINING)}.", "",
             "| protocol | call us | data step us | sync step us | GB/s a block | GB/s the device | signal us |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for protocol, m in models.items():
        lines.append(f"| {protocol} | {m.call_s * 1e6:.2f} | {m.step_s * 1e6:.3f} | {m.sync_s * 1e6:.3f} | "
                     f"{m.block_rate / 1e9:.1f} | {m.device_rate / 1e9:.0f} | {m.signal_s * 1e6:.3f} |")
    lines += ["", "| plan | per rank | protocol | predicted us | measured us | error | in the fit |",
              "|---|---|---|---:|---:|---:|---|"]
    errors = {True: [], False: []}
    for name, plan, nbytes, fitted, protocol, seconds in measured:
        predicted = gpu.seconds(plan, nbytes, models[protocol], protocol)
        err = predicted / seconds - 1
        errors[fitted].append(abs(err))
        lines.append(f"| {name} | {size_label(nbytes)} | {protocol} | {predicted * 1e6:.1f} | {seconds * 1e6:.1f} | "
                     f"{err:+.0%} | {'yes' if fitted else 'no'} |")
    lines.append("")
    for fitted, errs in errors.items():
        if errs:
            lines.append(f"{'In' if fitted else 'Not in'} the fit: median |error| {np.median(errs):.0%}, 90th "
                         f"percentile {np.percentile(errs, 90):.0%} over {len(errs)} (plan, size) pairs.")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", type=int, default=0, help="CUDA device index")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per bulk row (>= 1)")
    ap.add_argument("--ranks", type=int, default=8, help="emulated ranks of the bulk and packet parts (2..16)")
    ap.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                    help=f"comma-separated, of: {', '.join(PARTS)} (default {','.join(DEFAULT_PARTS)})")
    ap.add_argument("--quick", action="store_true", help="small sizes and counts: a smoke test, not a measurement")
    ap.add_argument("--measured", metavar="TUNE_MD",
                    help="tune part only: refit and check the model on the times an earlier run printed (its "
                         "tune.md), without a GPU")
    args = ap.parse_args(argv)
    if args.iters < 1:
        ap.error(f"--iters must be at least 1, got {args.iters}")
    if not 2 <= args.ranks <= 16:
        ap.error(f"--ranks must be 2..16 (one launch holds every emulated rank), got {args.ranks}")
    if args.device < 0:
        ap.error(f"--device must be at least 0, got {args.device}")
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown or not args.parts:
        ap.error(f"--parts: {', '.join(unknown) or repr('')} is not a part; the parts are {', '.join(PARTS)}")
    return args


def main(argv=None, timer=None) -> None:
    args = parse_args(argv)
    if args.measured:
        if args.parts != ["tune"]:
            raise SystemExit("--measured replays the tune part only: pass --parts tune")
        sizes = QUICK if args.quick else Sizes()
        print(f"{args.ranks} emulated ranks; times recorded in {args.measured}\n\n#### tune\n")
        print("\n".join(tune_table(None, args.ranks, sizes, args.iters, recorded_cells(args.measured, args.ranks,
                                                                                      sizes))))
        return
    if timer is None:
        usable, why = runtime.cuda_status()
        if not usable:
            raise SystemExit(f"benchmarks/cuda.py needs a GPU: {why}")
        timer = CudaTimer(args.device)
    sizes = QUICK if args.quick else Sizes()
    quick = " (--quick: small sizes, the numbers mean nothing)" if args.quick else ""
    print(f"GPU {args.device}: {timer.name()}; {args.ranks} emulated ranks{quick}")
    for part in PARTS:
        if part not in args.parts:
            continue
        print(f"\n#### {part}\n", flush=True)
        if part == "bulk":
            lines = bulk_table(timer, args.ranks, sizes, args.iters)
        elif part == "packet":
            lines = packet_table(timer, args.ranks, sizes, args.iters)
        elif part == "tune":
            lines = tune_table(timer, args.ranks, sizes, args.iters)
        else:
            lines = fused_table(timer, sizes)
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
