"""Calibration: the running job's `MachineModel`, fitted to short measurements of this machine.

The model (`jaxcoll.sim.machine`) is one formula: a fixed cost per call plus the work each of the plan's terms names
(helper threads joined, steps, bytes served by each cache level and by memory, fresh output pages, bytes through
shared segments or over the network, dependent signals between processes and network rounds) times a constant,
and a measured program's launch shared among its calls. Calibration measures a set of
calls whose terms differ, and fits the constants to their times by non-negative least squares on the relative
error (the same weight for a 50 us call as for a 50 ms one). The set (`training`):

- **shifts**: a ppermute that moves each rank's input to the next rank of its process, once or repeated 8 times in
  one call, and split into 1024 puts: copies at every footprint from 4 KiB to `probe_bytes` per rank (each cache
  level, then memory and fresh pages), alone and with helper threads, and the cost of a step; the shift of
  `STREAM_PROBE_BYTES`, whose buffers outgrow the caches, so it streams its writes, beside the same copies in
  steps too small to stream ("shift-cached");
- **the simplest plans of each collective**: the direct all_reduce (every rank rereads every input), the two-shot
  all_reduce, the direct all_gather and reduce_scatter, at 16 KiB, 1 MiB and 16 MiB per rank: reductions, and
  writes to many outputs;
- an all_gather of 4 MiB a rank, whose outputs (32 MiB a rank) lie past glibc's largest threshold of fresh pages,
  where the 16 MiB shift's lie before it: the fit chooses the threshold too (`fit_calls`);
- across processes, the shift to the next process (every chunk through a segment, or over the network), the same
  shift followed by a chain of `EXCHANGES` signals between the processes, each waiting for the last (what one
  dependent signal between processes costs: the other probes have one or two, and without the chain the fit put
  it anywhere from 0 to 27 us a signal on this VM), and the hierarchical plans.

The cache sizes are the machine's (sysfs). Plans not in the set (the ring, every synthesized plan) and other sizes
are predicted, not fitted: benchmarks/tuning.py reports the error on both, apart. Every process of a job must call
`calibrate` (each measurement is a collective over the job's devices); the job goes on with process 0's fit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Callable

from jaxcoll import distributed
from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step
from jaxcoll.sim.machine import (CPU_NT_BYTES, CPU_STREAM_BYTES, MachineModel, Work, chunk_bytes, cpu_runtime, terms,
                                 work)
from jaxcoll.tune import measure
from jaxcoll.tune.choice import threads_per_process

STEP_CHUNKS = 1024
ACROSS_CHUNKS = 64
EXCHANGES = 16
REPEATS = 8
LARGE_BYTES = 64 << 20
SHIFT_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)
PLAN_SIZES = (16 << 10, 1 << 20, 16 << 20)
FRESH_PROBE_BYTES = 4 << 20
# The shift whose writes stream (8 ranks: 256 MiB of buffers, past the 32 MiB from which the runtime streams), timed
# beside the same copies in steps too small to stream. Not a repeated shift: a lane runs until it waits, and a
# shift's never does, so each rank's repeats reread its own input from the last-level cache, not from memory.
STREAM_PROBE_BYTES = 16 << 20
# Thresholds of fresh output pages the fit chooses among (`fit_calls`): 128 KiB to 64 MiB a rank.
FRESH_THRESHOLDS = tuple(1 << k for k in range(17, 27))
PLANS = (("all_reduce", "direct"), ("all_reduce", "two_shot"), ("all_gather", "direct"),
         ("reduce_scatter", "direct"))


def shift_plan(processes: tuple[int, ...], across: bool, chunks: int = 1, repeats: int = 1) -> Plan:
    """A ppermute in which each rank sends its input to the next rank of its own process (`across` False) or to
    the rank at the same place in the next process (`across` True), as `chunks` puts, the whole `repeats` times."""
    perm = shift(processes, across)
    n = len(processes)
    dst = dict(perm)
    programs = []
    for r in range(n):
        steps = tuple(Step(Op.PUT if dst[r] != r else Op.COPY, (ChunkRef(r, Buffer.INPUT, c),),
                           (ChunkRef(dst[r], Buffer.OUTPUT, c),)) for _ in range(repeats) for c in range(chunks))
        programs.append(RankProgram(chunks, chunks, lanes=(Lane(steps),)))
    name = f"probe-shift{'-across' if across else ''}-{chunks}x{repeats}"
    return Plan(Collective.PPERMUTE, n, tuple(programs), name=name, perm=perm)


def exchange_plan(processes: tuple[int, ...], exchanges: int = EXCHANGES) -> Plan:
    """The shift to the next process (`shift_plan(processes, True)`), then `exchanges` rounds in which each rank
    signals the rank it sent to and waits for the signal of the rank that sent to it: every wait but the first
    follows a signal that followed the other process's previous wait, so the call holds a chain of `exchanges`
    dependent signals between processes and little else."""
    base = shift_plan(processes, True)
    dst = dict(base.perm)
    programs = []
    for r, prog in enumerate(base.ranks):
        rounds = (Step(Op.SIGNAL, peer=dst[r], sem=0), Step(Op.WAIT, sem=0)) * exchanges
        programs.append(RankProgram(prog.input_chunks, prog.output_chunks, semaphores=1,
                                    lanes=(Lane(prog.lanes[0].steps + rounds),)))
    return Plan(Collective.PPERMUTE, len(processes), tuple(programs), name=f"probe-exchanges-{exchanges}",
                perm=base.perm)


def shift(processes: tuple[int, ...], across: bool) -> tuple[tuple[int, int], ...]:
    """(source, destination) pairs: the next rank of the same process, or the same place in the next process."""
    groups: dict[int, list[int]] = {}
    for r, p in enumerate(processes):
        groups.setdefault(p, []).append(r)
    order = sorted(groups)
    pairs = []
    for i, p in enumerate(order):
        ranks = groups[p]
        for j, r in enumerate(ranks):
            if across:
                other = groups[order[(i + 1) % len(order)]]
                pairs.append((r, other[j % len(other)]))
            else:
                pairs.append((r, ranks[(j + 1) % len(ranks)]))
    return tuple(sorted(pairs))


def training(processes: tuple[int, ...], probe_bytes: int = LARGE_BYTES) -> list[tuple[str, int, dict]]:
    """The calls calibration measures: (collective, per-rank bytes, {name: plan}); the plans of one entry are
    timed side by side."""
    from jaxcoll import algorithms
    from jaxcoll.plan import Collective

    spans = len(set(processes)) > 1
    n = len(processes)
    local, repeated = shift_plan(processes, False), shift_plan(processes, False, repeats=REPEATS)
    steps = shift_plan(processes, False, STEP_CHUNKS)
    out = [("ppermute", 4 * n, {"shift": local, "steps": steps}), ("ppermute", 64 << 10, {"steps": steps})]
    if spans:  # many small chunks to the next process: what a step and a message across processes cost
        out.append(("ppermute", 64 << 10, {"across-steps": shift_plan(processes, True, ACROSS_CHUNKS)}))
    for size in sorted({*(s for s in SHIFT_SIZES if s <= probe_bytes), probe_bytes}):
        cells = {"shift": local, "repeated": repeated} if size * REPEATS <= 16 << 20 else {"shift": local}
        if size == STREAM_PROBE_BYTES and streamed(size, n):
            # The same copies in steps below the streaming threshold: the same bytes from the same footprint, read
            # from memory alike, the writes through the caches. The pair parts a streamed write from a cached one;
            # without it only the differences between plans, which a noisy machine swamps, part the two rates.
            cells["shift-cached"] = shift_plan(processes, False, -(-2 * size // CPU_NT_BYTES))
        if size == probe_bytes:
            cells["twice"] = shift_plan(processes, False, repeats=2)
        out.append(("ppermute", size, cells))
        if spans:  # another permutation: timed on its own
            across = {"across": shift_plan(processes, True)}
            if size == SHIFT_SIZES[0]:  # the same with a chain of signals between the processes after it
                across["exchanges"] = exchange_plan(processes)
            out.append(("ppermute", size, across))
    for size in PLAN_SIZES:
        if size > probe_bytes:
            continue
        for collective in ("all_reduce", "all_gather", "reduce_scatter"):
            names = [name for c, name in PLANS if c == collective]
            if spans:
                names.append("hierarchical")
            cells = {}
            for name in names:
                try:
                    cells[name] = algorithms.builtin(Collective(collective), name, n,
                                                     processes=processes if name == "hierarchical" else ())
                except ValueError:
                    continue  # a hierarchical reduction over processes of unequal sizes
            out.append((collective, size, cells))
    # Outputs on both sides of glibc's largest mmap threshold (32 MiB a rank, `fit_calls`): the 16 MiB shift's
    # outputs lie below it, this all_gather's (N times its input) at or above it.
    if FRESH_PROBE_BYTES <= probe_bytes:
        gather = algorithms.builtin(Collective.ALL_GATHER, "direct", n)
        out.append(("all_gather", FRESH_PROBE_BYTES, {"direct": gather}))
    return out


def streamed(size: int, n: int) -> bool:
    """Whether the executor writes the shift of `size` bytes a rank over `n` ranks with streaming stores
    (csrc/reduce.cc: the call's buffers, an input and an output a rank, then each step's destination)."""
    return n * 2 * size >= CPU_STREAM_BYTES and size >= CPU_NT_BYTES


def calibrate(devices=None, *, reps: int = 5, hosts=None, probe_bytes: int = LARGE_BYTES,
              progress: Callable[[str], None] | None = None, record: list | None = None,
              measured: list | None = None) -> MachineModel:
    """Measure this job's `MachineModel` on `devices` (default: every device of the job), `reps` samples per call,
    no call larger than `probe_bytes` per rank (smaller ones fit memory's rate less well: a footprint should
    outgrow the caches). `hosts[p]` is the host of process p (default: the job's own). Every process of the job
    must call it. `record`, a list, receives each measured call as {collective, bytes, name, seconds} (samples),
    for refitting or checking the fit apart; `measured`, a list, receives what the fit took, (plan, per-rank bytes,
    median seconds) each, for fitting again with more measurements (`refit`)."""
    import jax
    import numpy as np

    if not isinstance(probe_bytes, int) or probe_bytes < 4096:
        raise ValueError(f"calibrate: probe_bytes must be an integer of at least 4096, got probe_bytes={probe_bytes!r}")
    devices = list(jax.devices() if devices is None else devices)
    if {d.platform for d in devices} != {"cpu"}:
        raise ValueError(f"calibrate: the CPU runtime's model needs CPU devices, got platforms "
                         f"{sorted({d.platform for d in devices})}")
    processes = tuple(int(d.process_index) for d in devices)
    spans = len(set(processes)) > 1
    if hosts is None:
        from jaxcoll.topology.job import _job_hosts
        hosts = _job_hosts(max(processes) + 1)
    hosts = tuple(hosts)
    multi_host = spans and len({hosts[p] for p in set(processes)}) > 1
    layout = (processes if spans else None, hosts if multi_host else None)
    mesh = jax.sharding.Mesh(np.array(devices), ("i",))
    say = progress or (lambda _: None)
    n = len(devices)
    from jaxcoll.runtime import _jaxcoll
    shape = cpu_runtime(threads=threads_per_process(processes, hosts), solo_bytes=int(_jaxcoll.solo_bytes()),
                        caches=tuple((size, rate) for size, (_, rate) in zip(_cache_sizes(), _default_rates())))
    calls, times = [], []
    for collective, nbytes, plans in training(processes, probe_bytes):
        size = measure.per_rank_elements(nbytes, n, "float32") * 4
        say(f"{collective} {nbytes >> 10} KiB")
        perm = next(iter(plans.values())).perm if collective == "ppermute" else ()
        samples = measure.time_cell(collective, size, plans, mesh, reps=reps, perm=perm)
        for name, plan in plans.items():
            calls.append((plan, size))
            times.append(statistics.median(samples[name]))
            if record is not None:
                record.append({"collective": collective, "bytes": size, "name": name, "seconds": samples[name]})
    if measured is not None:
        measured.extend((plan, size, t) for (plan, size), t in zip(calls, times))
    return _agreed(spans, fit_calls(shape, calls, times, layout))


def refit(model: MachineModel, measured, layout=(None, None), spans: bool = False) -> MachineModel:
    """`model` fitted again to measured calls [(plan, per-rank bytes, seconds)] laid out as `layout` (processes,
    hosts): calibration's (`calibrate(measured=...)`) and more, such as the candidates a tuning run timed in its
    cells. Calibration's probes are measured once, minutes before the cells, on a machine whose speed drifts between
    minutes (the same call 6-32% apart at the median here, docs/tuning.md); a fit to hundreds of calls spread over
    the run averages that drift out, and prices the sizes and plans the run did not measure from all it did. With
    `spans`, every process of the job must call it and the job goes on with process 0's fit."""
    calls = [(plan, size) for plan, size, _ in measured]
    return _agreed(spans, fit_calls(model, calls, [t for *_, t in measured], layout))


def _agreed(spans: bool, model: MachineModel) -> MachineModel:
    """`model` here, or across a job process 0's: each process measured on its own, and every process must rank
    and run the same candidates."""
    if not spans:
        return model
    return MachineModel.from_json(json.loads(distributed.agree(f"tune/calibration/{_next_run()}",
                                                            lambda: json.dumps(model.to_json()))))


def row(plan: Plan, nbytes: int, shape: MachineModel, layout=(None, None), w: Work | None = None) -> list[float]:
    """One measured call's row of the fit: [1 (the call), *the busiest process's terms, network rounds, the share
    of its program's launch] of `plan` with `nbytes` per rank, its ranks laid out as `layout` (processes, hosts);
    `w`, the plan's work there, when already known. A measurement (`jaxcoll.tune.measure`) times a program that
    runs `iterations(nbytes)` calls: each carries that fraction of the launch."""
    w = w if w is not None else work(plan, *layout)
    per_process = terms(w, chunk_bytes(plan, nbytes), shape)
    busiest = int(per_process[:, 2:].sum(axis=1).argmax())
    return [1.0, *per_process[busiest], float(w.rounds), 1.0 / measure.iterations(nbytes)]


def fit(shape: MachineModel, rows, times) -> MachineModel:
    """The constants that make `shape`'s formula closest to `times` (relative least squares, all >= 0): `rows`
    are `row`'s per measured call. A byte served by a farther level never costs
    less than one served by a nearer (caches, then memory): the fit solves for the increments from level to
    level, each >= 0."""
    import numpy as np
    from scipy.optimize import nnls

    rows, times = np.asarray(rows, dtype=float), np.asarray(times, dtype=float)
    levels = slice(3, 3 + len(shape.caches) + 1)  # after [call, helpers, steps]: each cache level, then memory
    # A byte of level j pays the increments of levels 0..j: the column of increment i sums levels i and beyond.
    cumulative = rows.copy()
    cumulative[:, levels] = np.cumsum(rows[:, levels][:, ::-1], axis=1)[:, ::-1]
    # A term no measured call has (no network here), or one every call has alike (helpers on a GPU, where every
    # call is shared) and so cannot be told from the fixed cost, keeps the shape's constant.
    used = cumulative.any(axis=0) & ~(cumulative == cumulative[:, :1]).all(axis=0)
    used[0] = True
    coef = np.zeros(rows.shape[1])
    coef[used], _ = nnls(cumulative[:, used] / times[:, None], np.ones(len(times)))
    coef[levels] = np.cumsum(coef[levels])
    defaults = vector(shape)
    unset = ~used
    unset[levels] = unset[levels] & (coef[levels] == 0)  # a level fitted through its nearer ones is set
    coef[unset] = defaults[unset]
    return dataclasses.replace(shape.with_coefficients(coef[1:-2], call_s=coef[0], network_latency_s=coef[-2]),
                               launch_s=float(coef[-1]))


def fit_calls(shape: MachineModel, calls, times, layout=(None, None)) -> MachineModel:
    """`fit` to measured calls [(plan, per-rank bytes)] and their `times`, with the threshold of fresh output
    pages (`fresh_bytes`) chosen among `FRESH_THRESHOLDS` as the one that fits best.

    Which outputs come in fresh pages is the allocator's decision, not the plan's: glibc's malloc maps a block afresh
    above its mmap threshold, which starts at 128 KiB and rises, as large blocks are freed, up to 32 MiB
    (DEFAULT_MMAP_THRESHOLD_MAX), so in a process that has run a while only outputs of 32 MiB and more a rank fault
    in every call; another allocator draws the line elsewhere. Of thresholds that fit equally (no measured output
    lies between them) the largest is taken: fresh pages only where a measurement shows them."""
    import numpy as np

    times = np.asarray(times, dtype=float)
    works = [work(plan, *layout) for plan, _ in calls]
    best = None
    for threshold in FRESH_THRESHOLDS:
        trial = dataclasses.replace(shape, fresh_bytes=threshold)
        rows = np.asarray([row(plan, size, trial, layout, w) for (plan, size), w in zip(calls, works)])
        model = fit(trial, rows, times)
        residual = float(np.sum((rows @ vector(model) / times - 1) ** 2))
        if best is None or residual <= best[0] * (1 + 1e-9):
            best = (min(residual, best[0]) if best else residual, model)
    return best[1]


def vector(model: MachineModel):
    """The model's constants in the order of `row`'s columns: [call, *coefficients, network latency, launch]."""
    import numpy as np
    return np.concatenate([[model.call_s], model.coefficients(), [model.network_latency_s, model.launch_s]])


def _default_rates() -> list[tuple[int, float]]:
    """Starting rates for the fitted levels (only their sizes matter: the fit sets the rates)."""
    return list(MachineModel.caches) + [MachineModel.caches[-1]] * 4


_runs = 0


def _next_run() -> int:
    """A number that every process of a job draws in the same order: one per agreement a tuning run makes."""
    global _runs
    _runs += 1
    return _runs


def _cache_sizes() -> list[int]:
    """Bytes of the cache levels the runtime's threads use, smallest first (sysfs): the level-2 caches of the
    cores this process may run on taken together, and the last level; the model's defaults where sysfs says
    nothing."""
    levels: dict[int, int] = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(os.path.join(base, entry, "level")) as f:
                    level = int(f.read())
                with open(os.path.join(base, entry, "size")) as f:
                    text = f.read().strip()
                with open(os.path.join(base, entry, "type")) as f:
                    kind = f.read().strip()
            except (OSError, ValueError):
                continue
            if kind == "Instruction" or level < 2:
                continue
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            levels[level] = int(text.rstrip("KMG")) * scale
    except OSError:
        pass
    if not levels:
        return [size for size, _ in MachineModel.caches]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    sizes = [levels[2] * cores] if 2 in levels and len(levels) > 1 else []
    return sorted(set(sizes + [levels[max(levels)]]))

