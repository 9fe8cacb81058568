"""Calibration: the running job's `CpuModel`, from short microbenchmarks of its links.

Every probe is a ppermute on the CPU runtime that shifts each rank's input to a peer (one put step per rank unless
said otherwise), timed as `jaxcoll.tune.measure` times any collective, so what is measured is what a collective's
steps cost here:

- **call**: a shift inside each process of the smallest message: the fixed cost of a call on this layout (entry
  rendezvous, completion, and, across processes, the call's publication and its end).
- **step**: the same shift split into `STEP_CHUNKS` puts per rank: what decoding and dispatching a step costs.
- **cache rates**: for each cache level, a shift repeated `REPEATS` times in one call whose footprint is half the
  level: every byte comes from that level.
- **memory and fresh pages**: a shift of `LARGE_BYTES` per rank, once and twice in one call: the second pass
  costs only memory traffic, the first also faults in and zeroes the fresh output pages XLA allocates.
- **crossing** (several processes of one host): a shift to the next process, whose every chunk is copied through
  a shared segment: the segment copy rate.
- **network** (several hosts): the same shift over the network transport: its latency (smallest message) and rate.

The cache sizes are the machine's (sysfs: the private level-2 caches of the cores taken together, and the
last level). Each figure is the median of alternating samples; `calibrate` must be
called by every process of a job (the probes are collectives over all its devices).
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable

from jaxcoll import distributed
from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step
from jaxcoll.sim.cpu import CpuModel, chunk_bytes, seconds, work
from jaxcoll.tune import measure

STEP_CHUNKS = 1024
REPEATS = 8
LARGE_BYTES = 64 << 20
CROSSING_BYTES = 16 << 20
PROBES = 4  # progress steps of a calibration on one host, beside one per cache level (two more across processes)


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


def calibrate(devices=None, *, reps: int = 5, hosts=None, probe_bytes: int = LARGE_BYTES,
              progress: Callable[[str], None] | None = None) -> CpuModel:
    """Measure this job's `CpuModel` on `devices` (default: every device of the job), `reps` samples per probe,
    no probe larger than `probe_bytes` per rank (smaller ones calibrate memory less well: its footprint should
    outgrow the caches). `hosts[p]` is the host of process p (default: the job's own). Every process of the job
    must call it."""
    if not isinstance(probe_bytes, int) or probe_bytes < 4096:
        raise ValueError(f"calibrate: probe_bytes must be an integer of at least 4096, got probe_bytes={probe_bytes!r}")
    import jax
    import numpy as np

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
    mesh = jax.sharding.Mesh(np.array(devices), ("i",))
    say = progress or (lambda _: None)
    n = len(devices)
    layout = (processes if spans else None, hosts if multi_host else None)

    def timed(nbytes: int, **plans: Plan) -> dict[str, float]:
        perm = next(iter(plans.values())).perm
        t = measure.time_cell("ppermute", input_bytes(nbytes), plans, mesh, reps=reps, perm=perm)
        return {k: statistics.median(v) for k, v in t.items()}

    def input_bytes(nbytes: int) -> int:
        return measure.per_rank_elements(nbytes, n, "float32") * 4

    def steps(plan: Plan) -> int:
        return max(work(plan, *layout).steps)

    local = shift_plan(processes, False)
    say("call and step cost")
    many = shift_plan(processes, False, STEP_CHUNKS)
    t = timed(n * 4, one=local, many=many)
    call_s = t["one"]
    step_s = max(0.0, (t["many"] - t["one"]) / (steps(many) - steps(local)))
    model = CpuModel(call_s=call_s, step_s=step_s, threads=_threads_per_process(processes, hosts))

    def moved(plan: Plan, nbytes: int) -> tuple[float, int]:
        """(bytes the plan's busiest process touches, threads the call runs on) at `nbytes` per rank."""
        w = work(plan, *layout)
        chunk = chunk_bytes(plan, input_bytes(nbytes))
        threads = 1 if w.traffic * chunk <= model.solo_bytes else model.threads
        return max(float(t.sum()) for t in w.touched) * chunk, threads

    def overhead(plan: Plan, threads: int) -> float:
        return model.call_s + max(work(plan, *layout).steps) * model.step_s / threads

    repeated = shift_plan(processes, False, repeats=REPEATS)
    caches = []
    for size in _cache_sizes():
        per_rank = min(probe_bytes, max(4 << 10, size // 2 // (2 * n)))  # the footprint: inputs and outputs
        say(f"cache rate, {size >> 20} MiB level")
        measured = timed(per_rank, probe=repeated)["probe"]
        nbytes, threads = moved(repeated, per_rank)
        caches.append((size, nbytes / threads / max(measured - overhead(repeated, threads), 1e-9)))

    say("memory rate and fresh pages")
    twice = shift_plan(processes, False, repeats=2)
    t = timed(probe_bytes, once=local, twice=twice)
    once_bytes, threads = moved(local, probe_bytes)
    memory_rate = once_bytes / threads / max(t["twice"] - t["once"], 1e-9)
    outputs = max(sum(w) for w in work(local, *layout).outputs) * chunk_bytes(local, input_bytes(probe_bytes))
    left = t["once"] - overhead(local, threads) - once_bytes / threads / memory_rate
    fresh_rate = outputs / threads / left if left > 0 else float("inf")
    model = CpuModel(**{**model.__dict__, "caches": tuple(caches) or CpuModel.caches, "memory_rate": memory_rate,
                        "fresh_rate": min(fresh_rate, 1e15)})

    if spans:
        across = shift_plan(processes, True)
        field = "network_rate" if multi_host else "crossing_rate"
        if multi_host:
            say("network latency")
            wa = work(across, *layout)
            free = CpuModel(**{**model.__dict__, "network_latency_s": 0.0})
            t_small = timed(n * 4, probe=across)["probe"]
            latency = max(0.0, t_small - seconds(across, input_bytes(n * 4), free, wa)) / max(1, wa.rounds)
            model = CpuModel(**{**model.__dict__, "network_latency_s": latency})
        say(f"{'network' if multi_host else 'crossing'} rate")
        size = input_bytes(min(CROSSING_BYTES, probe_bytes))
        measured = timed(min(CROSSING_BYTES, probe_bytes), probe=across)["probe"]
        wa = work(across, *layout)
        chunk = chunk_bytes(across, size)
        moved = max(wa.network) if multi_host else max(wa.crossing)
        free = CpuModel(**{**model.__dict__, field: float("inf")})
        rest = measured - seconds(across, size, free, wa)
        if rest > 0 and moved:
            model = CpuModel(**{**model.__dict__, field: moved * chunk / rest})
        # Each process measured on its own; the job goes on with process 0's numbers, so that every process
        # ranks and runs the same candidates.
        model = CpuModel.from_json(json.loads(distributed.agree(f"tune/calibration/{_next_run()}",
                                                                lambda: json.dumps(model.to_json()))))
    return model


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
        return [size for size, _ in CpuModel.caches]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    sizes = [levels[2] * cores] if 2 in levels and len(levels) > 1 else []
    return sorted(set(sizes + [levels[max(levels)]]))


def _threads_per_process(processes: tuple[int, ...], hosts: tuple[int, ...]) -> int:
    """Threads a process's call uses with helpers: one per core, the cores shared by the processes of its host
    (processes told apart as hosts by JAXCOLL_TRANSPORT=tcp still share this machine's cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, len(set(processes))))
