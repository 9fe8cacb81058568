"""The CPU executor's cost of a plan: what one call takes on this machine, from the plan's work and a measured model.

The CPU runtime is not a network of links (docs/runtime.md, "One call"): the last rank to arrive runs the lanes of
every rank of its process, cooperatively on one thread, with helper threads on the other cores once the call moves
more than `solo_bytes`; a wait costs a switch to another lane, not a trip over a wire. What a call costs is the
memory traffic of its steps, and where that traffic is served from:

    t_call                                       entry rendezvous, completion (per layout: across processes
                                                 it includes the call's publication and its end)
  + t_helpers, when the call is shared           waking the helper threads and joining them
  + steps x t_step / threads                     decoding and dispatching each step
  + sum over touches of bytes / rate(level) / threads
                                                 every chunk read or written by a step, at the rate of the
                                                 smallest cache level that holds it: one at least as large as
                                                 the traffic since the chunk was last touched in the call, or
                                                 as the call's whole footprint (the loop's previous call left
                                                 it there); memory's rate when none does
  + reduced bytes / reduce rate / threads         what a reduction adds to its sources' touches: the executor
                                                 copies with memcpy, but sums two or more sources through an
                                                 accumulator tile, element by element (docs/runtime.md, "Data
                                                 steps"); every source byte of such a step
  + streamed bytes / stream rate / threads       in a call whose buffers (every rank's inputs, outputs and
                                                 scratch) hold at least `stream_bytes`, the executor writes
                                                 destinations of at least `nt_bytes` a step with non-temporal
                                                 stores (docs/runtime.md, "Data steps"): no read for
                                                 ownership, and past the caches, so a later read of such a
                                                 chunk in the call is served by memory
  + fresh output bytes / fresh rate / threads     XLA allocates large outputs afresh each call: the kernel
                                                 zeroes every page the call first writes (docs/runtime.md,
                                                 "Fresh pages"), for outputs of at least `fresh_bytes` a rank
  + crossing bytes / crossing rate               chunks of XLA's buffers copied through shared segments for
                                                 peer processes
  + process rounds x crossing latency             the longest chain of steps that wait on another process: each
                                                 link a signal that wakes a thread of another process
  + network bytes / network rate + messages x t_message + rounds x network latency
                                                 puts and gets to processes on other hosts, what each message
                                                 costs, and the longest chain of dependent exchanges

and the process that takes longest decides (processes run their ranks at the same time). The order of touches is
the executor's: lanes interleave step by step across ranks. So a plan that reuses a chunk soon after writing it (a
ring's reduce-then-forward, a tree's small pipelined chunks) pays the cache's rate for the reuse, and one that
rereads the whole input on every rank (the direct all_reduce) pays DRAM's once the inputs outgrow the cache.

The constants are `MachineModel`'s, measured by `jaxcoll.tune.calibration` on the running job; `MachineModel()`
holds this project's VM's. This is NCCL's tuning.cc in spirit (named latencies and rates, one formula), read off
each plan's steps, so built-in, synthesized, imported and registered plans are priced alike. The GPU round fits
the same formula to the CUDA executor's emulated ranks (benchmarks/cuda.py, part "tune"), every rank on blocks of
its own (threads = ranks) and no helper threads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from jaxcoll.plan import Buffer, Op, Plan
from jaxcoll.plan.collectives import InPlace, definition


@dataclasses.dataclass(frozen=True)
class MachineModel:
    """Measured constants of the CPU runtime on one job layout (seconds, bytes, bytes per second per thread).

    Defaults: fitted on this project's VM (2 cores of an AMD EPYC, 2 x 1 MiB L2, 32 MiB L3, 8 CPU devices in one
    process; `jaxcoll tune --calibrate-only`, two runs of 2026-11-27), a starting point that
    `jaxcoll.tune.calibrate` replaces with the machine at hand."""

    call_s: float = 55e-6
    helpers_s: float = 70e-6  # what a call shared with helper threads adds: waking them, joining them
    step_s: float = 13e-9
    # (size in bytes, bytes read or written per second per thread) of each cache level, smallest first
    caches: tuple[tuple[int, float], ...] = ((2 << 20, 45e9), (32 << 20, 18e9))
    memory_rate: float = 8e9  # the same, served by memory
    stream_rate: float = 8e9  # bytes written with non-temporal stores per second per thread
    reduce_rate: float = 1e15  # source bytes of reductions per second per thread, beyond their touches (free until
    # fitted: the defaults above predate the term)
    fresh_rate: float = 60e9  # bytes of fresh output pages faulted in and zeroed per second per thread
    # Outputs of at least this many bytes a rank come in fresh pages: XLA:CPU's buffers come from the C library's
    # allocator, which maps large blocks afresh. glibc's threshold starts at 128 KiB and rises with every large block
    # freed, up to 32 MiB, where a process that has run a while keeps it; calibration measures it
    # (`jaxcoll.tune.calibration.fit_calls`).
    fresh_bytes: int = 32 << 20
    crossing_rate: float = 4e9  # bytes/s of chunks copied through shared segments between processes
    crossing_latency_s: float = 20e-6  # one dependent signal between processes: the peer's thread woken
    network_rate: float = 1.25e9  # bytes/s per TCP connection, one direction
    network_latency_s: float = 50e-6  # one dependent message exchange between hosts
    network_message_s: float = 20e-6  # what each message to another host costs its sender and receiver
    solo_bytes: int = 2 << 20  # JAXCOLL_SOLO_BYTES: above it a call is shared with helper threads
    # A call whose buffers (every rank's inputs, outputs and scratch) hold at least `stream_bytes` writes its
    # destinations of at least `nt_bytes` a step with non-temporal stores (the CPU runtime's JAXCOLL_NT_CALL_BYTES
    # and JAXCOLL_NT_BYTES: CPU_STREAM_BYTES and CPU_NT_BYTES, which `cpu_runtime` sets). Off here: the GPU round's
    # executor never streams.
    stream_bytes: int = 1 << 62
    nt_bytes: int = 256 << 10
    threads: int = 2  # threads a process's call uses once helpers join (one per core)
    # Not a call's: what a measured program adds once however many calls it runs (starting it on every device and
    # waiting for them; jaxcoll.tune.measure shares it among its calls). Calibration fits it so that the call's
    # constants are not, and `seconds` leaves it out: in a user's program the launch is the program's.
    launch_s: float = 0.0

    def coefficients(self) -> np.ndarray:
        """The model's constants in the order of `terms`' columns: seconds per unit of each."""
        return np.array([self.helpers_s, self.step_s, *(1 / r for _, r in self.caches), 1 / self.memory_rate,
                         1 / self.reduce_rate, 1 / self.stream_rate, 1 / self.fresh_rate, 1 / self.crossing_rate,
                         1 / self.network_rate, self.network_message_s, self.crossing_latency_s])

    def with_coefficients(self, c: Sequence[float], call_s: float, network_latency_s: float) -> "MachineModel":
        """This model with the constants `coefficients` orders (a fitted vector; a zero rate term is an
        unmeasurably fast rate)."""
        def rate(x):
            return 1 / x if x > 0 else 1e15
        k = len(self.caches)
        return dataclasses.replace(
            self, call_s=call_s, helpers_s=c[0], step_s=c[1],
            caches=tuple((size, rate(x)) for (size, _), x in zip(self.caches, c[2:2 + k])),
            memory_rate=rate(c[2 + k]), reduce_rate=rate(c[3 + k]), stream_rate=rate(c[4 + k]),
            fresh_rate=rate(c[5 + k]), crossing_rate=rate(c[6 + k]), network_rate=rate(c[7 + k]),
            network_message_s=c[8 + k], crossing_latency_s=c[9 + k], network_latency_s=network_latency_s)

    def rate(self, reach: np.ndarray) -> np.ndarray:
        """Bytes per second per thread of touches that need a cache of `reach` bytes to hit."""
        out = np.full(reach.shape, self.memory_rate)
        for size, rate in reversed(self.caches):
            out[reach <= size] = rate
        return out

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["caches"] = [list(level) for level in self.caches]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "MachineModel":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if not isinstance(d, dict):
            raise ValueError(f"MachineModel: expected an object, got {d!r}"[:200])
        unknown = set(d) - set(fields)
        if unknown:
            raise ValueError(f"MachineModel: unknown fields {sorted(unknown)}")
        d = dict(d)
        if "caches" in d:
            levels = d.pop("caches")
            try:
                caches = tuple((int(size), float(rate)) for size, rate in levels)
            except (TypeError, ValueError):
                raise ValueError(f"MachineModel: caches must be [size, rate] pairs, got {levels!r}") from None
            if any(size <= 0 or not (rate > 0 and math.isfinite(rate)) for size, rate in caches):
                raise ValueError(f"MachineModel: caches must have sizes and rates > 0, got {levels!r}")
            return dataclasses.replace(cls.from_json(d), caches=tuple(sorted(caches)))
        for name, value in d.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"MachineModel: {name} must be a finite number, got {value!r}")
            positive = name.endswith("rate") or name in ("threads", "fresh_bytes", "stream_bytes")
            if value < 0 or (positive and value <= 0):
                raise ValueError(f"MachineModel: {name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
        return cls(**{k: (int(v) if fields[k].type in ("int", int) else float(v)) for k, v in d.items()})


@dataclasses.dataclass(frozen=True)
class Work:
    """What a plan asks of each process per call, in chunks (multiply by the chunk's bytes)."""

    reuse: tuple[np.ndarray, ...]  # per process: traffic from each touch's chunk's last touch through it (inf: first)
    touched: tuple[np.ndarray, ...]  # per process: the chunks each touch reads or writes
    scratch: tuple[np.ndarray, ...]  # per process: whether each touch is of scratch (held in the accumulation type)
    written: tuple[np.ndarray, ...]  # per process: whether each touch is a write of a step with sources (a copy or
    # a reduction: what may stream; a zeroing step's memset never does)
    after: tuple[np.ndarray, ...]  # per process: the chunks of the step that last wrote each touch's chunk (0: none)
    reduced: tuple[np.ndarray, ...]  # per process: whether each touch is a source of a step of two or more sources
    footprint: tuple[int, ...]  # per process: distinct chunks its steps touch
    outputs: tuple[tuple[int, ...], ...]  # per process: each of its ranks' output chunks
    crossing: tuple[float, ...]  # per process: chunks of its XLA buffers that peer processes name (copied in/out)
    network: tuple[float, ...]  # per process: chunks its steps move over the network
    messages: tuple[int, ...]  # per process: the network messages its steps send (a remote chunk each)
    steps: tuple[int, ...]  # per process: data and sync steps
    traffic: float  # the whole call's chunks read + written (what the executor's solo threshold reads)
    rounds: int  # dependent exchanges between hosts on the longest chain
    process_rounds: int = 0  # dependent signals between processes on the longest chain
    # Chunks of every rank's input and output buffers, and of every rank's scratch: what the executor's test of
    # whether a call streams reads (csrc/lanes.cc, call_footprint_bytes), however often the steps reread them
    held: float = 0.0
    held_scratch: float = 0.0


def work(plan: Plan, processes: Sequence[int] | None = None, hosts: Sequence[int] | None = None) -> Work:
    """The work of `plan` when rank r runs in process `processes[r]` (default: all in one) and process p on host
    `hosts[p]` (default: one host). Linear in the plan's steps."""
    n = plan.nranks
    processes = tuple(processes) if processes else (0,) * n
    if len(processes) != n:
        raise ValueError(f"processes names {len(processes)} ranks, the plan has {n}")
    procs = sorted(set(processes))
    index = {p: i for i, p in enumerate(procs)}
    host_of = (lambda p: 0) if hosts is None else (lambda p: hosts[p])
    np_ = len(procs)
    network = [0.0] * np_
    messages = [0] * np_
    steps = [0] * np_
    foreign: list[set] = [set() for _ in range(np_)]
    # Touches in step order across the ranks: step i of every rank before step i+1. The executor runs each rank's
    # lanes until they wait (csrc/lanes.cc, GroupRun::pass), so a plan without waits runs rank by rank; pricing
    # reuse by that order instead predicted no better (eight sample files of 2026-11-28, each size held out: the
    # median within half a point, the 90th percentile 3 points better to 1.5 worse; docs/tuning.md, "Streaming by
    # what a call holds").
    order = sorted(((i, r, l) for r, prog in enumerate(plan.ranks) for l, lane in enumerate(prog.lanes)
                    for i in range(len(lane.steps))))
    clock = [0] * np_
    last: list[dict] = [{} for _ in range(np_)]
    reuse: list[list[float]] = [[] for _ in range(np_)]
    touched: list[list[int]] = [[] for _ in range(np_)]
    scratch: list[list[bool]] = [[] for _ in range(np_)]
    written: list[list[bool]] = [[] for _ in range(np_)]
    after: list[list[int]] = [[] for _ in range(np_)]
    reduced: list[list[bool]] = [[] for _ in range(np_)]
    wrote: list[dict] = [{} for _ in range(np_)]  # chunk -> the chunks of the step that last wrote it
    traffic = 0
    for r, prog in enumerate(plan.ranks):
        steps[index[processes[r]]] += sum(len(lane.steps) for lane in prog.lanes)
    for i, r, l in order:
        step = plan.ranks[r].lanes[l].steps[i]
        if not step.op.is_data:
            continue
        me = index[processes[r]]
        seen, dist, sizes = last[me], reuse[me], touched[me]
        refs = step.dsts if step.op is Op.ZERO else step.srcs + step.dsts
        for j, ref in enumerate(refs):
            key = (ref.rank, ref.buffer, ref.index)
            before = seen.get(key)
            is_write = j >= len(refs) - len(step.dsts)
            written[me].append(is_write and step.op is not Op.ZERO)
            reduced[me].append(not is_write and len(step.srcs) > 1)
            after[me].append(wrote[me].get(key, 0))
            for c in ref.indices():
                if is_write:
                    wrote[me][(ref.rank, ref.buffer, c)] = ref.count if step.op is not Op.ZERO else 0
                else:
                    wrote[me].pop((ref.rank, ref.buffer, c), None)
            # the traffic from the chunk's last touch through this one: what a cache must hold for a hit
            dist.append(math.inf if before is None else clock[me] + ref.count - before)
            sizes.append(ref.count)
            scratch[me].append(ref.buffer is Buffer.SCRATCH)
            clock[me] += ref.count
            for j in ref.indices():
                seen[(ref.rank, ref.buffer, j)] = clock[me]
            traffic += ref.count
            owner = index[processes[ref.rank]]
            if owner == me:
                continue
            if host_of(processes[ref.rank]) != host_of(processes[r]):
                network[me] += ref.count
                messages[me] += 1
            elif ref.buffer is not Buffer.SCRATCH:  # XLA's buffers are private: copied through a segment
                foreign[owner].update((ref.rank, ref.buffer, j) for j in ref.indices())
    if plan.in_place:  # the executor's staging copies (docs/runtime.md, "One call", step 3): first touches
        for r, prog in enumerate(plan.ranks):
            me = index[processes[r]]
            copies_out = definition(plan.collective).in_place is InPlace.OUTPUT_IN_INPUT  # out of the staging
            copies = prog.input_chunks + (prog.output_chunks if copies_out else 0)
            reuse[me].extend([math.inf, math.inf])
            touched[me].extend([copies, copies])
            scratch[me].extend([False, False])
            written[me].extend([False, False])
            reduced[me].extend([False, False])
            after[me].extend([0, 0])
    footprint = tuple(len(seen) for seen in last)
    outputs = tuple(tuple(prog.output_chunks for r, prog in enumerate(plan.ranks) if index[processes[r]] == p)
                    for p in range(np_))
    crossing = tuple(2.0 * len(f) for f in foreign)
    multi_host = hosts is not None and len({host_of(p) for p in procs}) > 1
    rounds = _network_rounds(plan, processes, host_of, requested_pulls=True) if multi_host else 0
    process_rounds = _network_rounds(plan, processes, lambda p: p) if np_ > 1 else 0
    held = float(sum(prog.input_chunks + prog.output_chunks for prog in plan.ranks))
    held_scratch = float(sum(prog.scratch_chunks for prog in plan.ranks))
    return Work(tuple(np.asarray(d, dtype=float) for d in reuse), tuple(np.asarray(t, dtype=float) for t in touched),
                tuple(np.asarray(x, dtype=bool) for x in scratch), tuple(np.asarray(x, dtype=bool) for x in written),
                tuple(np.asarray(x, dtype=float) for x in after), tuple(np.asarray(x, dtype=bool) for x in reduced),
                footprint, outputs, crossing, tuple(network), tuple(messages), tuple(steps), float(traffic), rounds,
                process_rounds, held, held_scratch)


def _network_rounds(plan: Plan, processes, host_of, requested_pulls: bool = False) -> int:
    """The longest chain of steps that cross hosts, following each lane's order and each signal to its wait
    (`host_of(p)`: process p's host; the identity counts the crossings between processes). With
    `requested_pulls`, a get counts its request and its answer: the network transport sends one, then the other
    (csrc/transport/tcp.cc); through shared memory a process reads its peer's segment in place."""
    from jaxcoll.sim.engine import simulate
    from jaxcoll.topology import Topology

    # Simulated on the hosts alone: one microsecond for every crossing between hosts, nothing inside a host,
    # bandwidth too large to matter; the simulated time is then the number of dependent crossings.
    n = plan.nranks
    hosts = sorted({host_of(p) for p in processes})
    links = []
    for r in range(n):
        h = f"h{host_of(processes[r])}"
        links += [(r, h, 1e12, 0.0), (h, r, 1e12, 0.0)]
    for h in hosts:
        links += [(f"h{h}", "net", 1e12, 0.5), ("net", f"h{h}", 1e12, 0.5)]
    topo = Topology("hosts", n, [f"h{h}" for h in hosts] + ["net"], links)
    return int(round(simulate(plan, topo, 1.0, requested_pulls=requested_pulls) / 1e-6))


# The CPU runtime's defaults for when a call streams (csrc/reduce.cc: JAXCOLL_NT_CALL_BYTES, JAXCOLL_NT_BYTES;
# tests/test_tune_model.py holds these to the C++ source).
CPU_STREAM_BYTES = 32 << 20
CPU_NT_BYTES = 256 << 10


def cpu_runtime(**constants) -> MachineModel:
    """A model of the CPU runtime: `constants` over the defaults, its streaming stores priced where the executor
    makes them (`CPU_STREAM_BYTES`, `CPU_NT_BYTES`). Calibration tells them from reads served by memory with a
    pair of probes that differ only in them (`jaxcoll.tune.calibration.training`, "repeated-cached")."""
    return MachineModel(**{"stream_bytes": CPU_STREAM_BYTES, "nt_bytes": CPU_NT_BYTES, **constants})


def chunk_bytes(plan: Plan, input_bytes: float) -> float:
    """Bytes of one chunk when each rank's input holds `input_bytes`."""
    return float(input_bytes) / plan.in_blocks / plan.chunk_factor


def terms(w: Work, chunk: float, model: MachineModel, widen: float = 1.0) -> np.ndarray:
    """Per process, what each of the model's constants multiplies (`MachineModel.coefficients`' order): helpers
    (1 when the call is shared with helper threads), steps per thread, bytes per thread served by each cache
    level and by memory, source bytes per thread of reductions, bytes per thread written with streaming stores,
    fresh output bytes per thread, bytes through segments, bytes and messages over the network, and the call's
    dependent signals between processes (the same in every process's row). `widen` is how
    many times larger a scratch element is than a data element (2 for 16-bit floats, whose partial sums scratch
    holds as float32)."""
    threads = 1 if w.traffic * chunk <= model.solo_bytes else model.threads
    streams = (w.held + w.held_scratch * widen) * chunk >= model.stream_bytes
    sizes = [size for size, _ in model.caches]
    rows = []
    for p in range(len(w.steps)):
        reach = np.minimum(w.reuse[p], w.footprint[p]) * chunk
        weights = np.where(w.scratch[p], w.touched[p] * widen, w.touched[p])
        streamed = np.zeros(len(reach), dtype=bool)
        if streams:  # the executor's test is per step, on the data type's bytes (csrc/reduce.cc)
            streamed = w.written[p] & (w.touched[p] * chunk >= model.nt_bytes)
            reach = np.where(w.after[p] * chunk >= model.nt_bytes, math.inf, reach)  # written past the caches
        level = np.searchsorted(np.asarray(sizes, dtype=float), reach, side="left")  # len(sizes): memory
        served = np.bincount(level[~streamed], weights=weights[~streamed], minlength=len(sizes) + 1) * chunk / threads
        fresh = sum(c for c in w.outputs[p] if c * chunk >= model.fresh_bytes) * chunk
        rows.append([float(threads > 1), w.steps[p] / threads, *served, weights[w.reduced[p]].sum() * chunk / threads,
                     weights[streamed].sum() * chunk / threads,
                     fresh / threads, w.crossing[p] * chunk, w.network[p] * chunk, float(w.messages[p]),
                     float(w.process_rounds)])
    return np.asarray(rows)


def seconds(plan: Plan, input_bytes: float, model: MachineModel, w: Work | None = None,
            processes: Sequence[int] | None = None, hosts: Sequence[int] | None = None, dtype="float32") -> float:
    """Predicted seconds of one call of `plan` with `input_bytes` per rank input of `dtype` (see the module
    docstring): the fixed cost, the slowest process's terms times the model's constants, the network's rounds."""
    w = w if w is not None else work(plan, processes, hosts)
    per_process = terms(w, chunk_bytes(plan, input_bytes), model, widen(dtype)) @ model.coefficients()
    return model.call_s + float(per_process.max()) + w.rounds * model.network_latency_s


def widen(dtype) -> float:
    """Bytes of a scratch element over a data element: scratch holds the accumulation type (float32 for 16-bit
    floats; the data type otherwise)."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return 2.0 if name in ("float16", "bfloat16") else 1.0


__all__ = ["CPU_NT_BYTES", "CPU_STREAM_BYTES", "MachineModel", "Work", "chunk_bytes", "cpu_runtime", "seconds",
           "terms", "widen", "work"]
