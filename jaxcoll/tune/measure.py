"""Timing collectives on the running job: the measurements behind calibration, validation and `jaxcoll tune`.

A measurement is one jitted shard_map program per candidate that runs the collective `iters` times back to back
in a fori_loop (the carry feeds each call, so XLA can neither hoist nor merge them), timed per program call and
divided by `iters`: the seconds of one call inside a compiled program, the quantity `jaxcoll.tune.predict`
predicts. The candidates of a cell alternate call by call, after untimed warm-up calls of each, so that all see
the same machine state (this VM's timings swing by 2x between runs; side by side they compare).

Every process of a job runs the same programs in the same order (each program is a collective over the whole
group); the times are process 0's, and every process returns the same medians (exchanged through the job's
key-value store is not needed: the slowest process bounds every call).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np

LOOP_BYTES = 1 << 20
MAX_ITERS = 20
# Visits of every cell a tuning run and the validation make by default (`time_cells`). On this project's VM, six
# alternating one-process validation runs of 2026-11-28 (docs/tuning.md, "Cells in passes") put each size's cells,
# predicted from the others, within 6.5-8.1% at the median and 22.9-27.9% at the 90th percentile in three passes,
# 8.1-17.7% and 30.9-47.9% in one.
PASSES = 3


def default_passes(reps: int) -> int:
    """The visits of each cell when none are asked for: PASSES, or fewer where a candidate has fewer calls."""
    return min(PASSES, reps)


def iterations(nbytes: int) -> int:
    """Collective calls per timed program launch for `nbytes` per rank: back to back below 1 MiB, where a launch of
    an 8-device program (about 0.1 ms here) would hide the collective; one per launch from 1 MiB up. A loop's carry
    costs a copy of the result per iteration on both sides (XLA cannot write a custom call's or an all-reduce's
    result into the carry's buffer), which at large sizes is as much traffic as the collective itself. all_gather's
    program returns the rank's own block of the gathered array (1/N of what the collective wrote), which leaves the
    gathered array inside the program, as a model's use of it does. reduce_scatter's carry is the input with the
    result written over its first block; a one-call program returns the result itself, since the carry would copy
    the whole input into a fresh output on both sides, twice the collective's traffic."""
    return 1 if nbytes >= LOOP_BYTES else int(min(MAX_ITERS, LOOP_BYTES // max(nbytes, 1)))


def program(collective: str, mesh, axis: str, iters: int, algorithm, perm=()):
    """A jitted program running jaxcoll's `collective` `iters` times on a carried per-rank buffer with
    `algorithm` (a built-in name, "auto", a Plan, or "xla" for jax.lax's own collective); `perm` is
    ppermute's."""
    import jax
    from jax import lax
    from jax.sharding import PartitionSpec as P

    from jaxcoll import collectives

    kw = {} if algorithm in ("auto", "xla") else {"algorithm": algorithm}
    xla = algorithm == "xla"
    if collective == "all_reduce":
        def call(x):  # the sum is invariant over the axis; the loop carry stays varying
            y = lax.psum(x, axis) if xla else collectives.all_reduce(x, axis, **kw)
            return lax.pcast(y, axis, to="varying")
    elif collective == "all_gather":
        def call(x):  # keeps the rank's own block: the gathered array stays inside, as a model's use of it does
            y = lax.all_gather(x, axis, tiled=True) if xla else collectives.all_gather(x, axis, tiled=True, **kw)
            return lax.dynamic_slice_in_dim(y, lax.axis_index(axis) * x.shape[0], x.shape[0])
    elif collective == "reduce_scatter":
        def call(x):
            y = (lax.psum_scatter(x, axis, tiled=True) if xla
                 else collectives.reduce_scatter(x, axis, tiled=True, **kw))
            # one call per launch returns the result itself; a loop writes it over the carry's first block
            return y if iters == 1 else lax.dynamic_update_slice_in_dim(x, y, 0, 0)
    elif collective == "all_to_all":
        def call(x):
            return (lax.all_to_all(x, axis, 0, 0, tiled=True) if xla
                    else collectives.all_to_all(x, axis, 0, 0, tiled=True, **kw))
    elif collective == "ppermute":
        def call(x):
            return lax.ppermute(x, axis, perm) if xla else collectives.ppermute(x, axis, perm, **kw)
    else:
        raise ValueError(f"collective={collective!r} cannot be timed; known: all_reduce, all_gather, "
                         f"reduce_scatter, all_to_all, ppermute")
    body = call if iters == 1 else (lambda x: lax.fori_loop(0, iters, lambda _, y: call(y), x))
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=P(axis)))


def per_rank_elements(nbytes: int, n: int, dtype) -> int:
    """Elements per rank for about `nbytes` per rank: a multiple of n (the collectives split it n ways)."""
    return max(n, nbytes // np.dtype(dtype).itemsize // n * n)


def time_cell(collective: str, nbytes: int, candidates: Mapping[str, object], mesh, *, axis: str = "i",
              reps: int = 5, warmup: int = 2, dtype="float32", perm=()) -> dict[str, list[float]]:
    """Seconds per call of each candidate (name -> algorithm) for `collective` at `nbytes` per rank over the
    mesh axis `axis`, `reps` samples each, the candidates alternating call by call (`perm`: ppermute's)."""
    return time_cells([(collective, nbytes, candidates)], mesh, axis=axis, reps=reps, warmup=warmup, dtype=dtype,
                      perm=perm)[0]


def time_cells(cells: Sequence[tuple[str, int, Mapping[str, object]]], mesh, *, axis: str = "i", reps: int = 5,
               warmup: int = 2, passes: int | None = None, dtype="float32", perm=(),
               progress: Callable[[int], None] | None = None,
               memory: int | None = None) -> list[dict[str, list[float]]]:
    """`time_cell` for each (collective, nbytes, candidates) of `cells`, visiting the cells in turn `passes` times
    (`default_passes(reps)` if None) and taking about `reps / passes` rounds of each at every visit. Within a visit
    the candidates alternate call by call, as in `time_cell`; across visits, a cell's samples span the whole
    measurement rather than the minute its turn came. On a machine whose speed drifts from minute to minute (this
    project's VM: the same call, timed twice minutes apart, differs by 6-32% at the median), one visit puts every
    candidate of a cell in the same slow or fast minute, and that minute, not the plans, then sets the cell's
    times. A later visit starts with one untimed call of each candidate: what the cells between left in the caches
    and the allocator is not the cell's own. `progress(i)` is called after each visit of cell i.

    Every program of the cells visited together is compiled before any is timed, and a compiled call site holds
    its scratch (and, across processes, its shared segment) for as long as it lives. So the cells are taken in
    groups whose programs hold at most `memory` bytes in this process (`memory_budget(mesh)` if None): each group
    is compiled, visited `passes` times and dropped before the next is compiled. A cell whose candidates alone
    hold more is measured in subsets that fit, each with the cell's first candidate (`candidate_subsets`), and its
    subsets' times are tied together through that candidate's (`merge_subsets`). One cell alone (`time_cell`) is
    measured whole unless `memory` is given."""
    import jax

    if passes is None:
        passes = default_passes(reps)
    if passes < 1 or reps < passes:
        raise ValueError(f"time_cells: passes must be between 1 and reps={reps}, got {passes}")
    n = mesh.shape[axis]
    sharding = jax.NamedSharding(mesh, jax.P(axis))
    processes = [int(d.process_index) for d in mesh.devices.flat]
    me = jax.process_index()
    local = sum(p == me for p in processes)
    counts = [per_rank_elements(nbytes, n, dtype) for _, nbytes, _ in cells]
    if len(cells) > 1 and memory is None:
        memory = memory_budget(mesh)
    units = []  # (cell, its candidates measured together, what they hold)
    for i, ((collective, _, candidates), count) in enumerate(zip(cells, counts)):
        size = count * np.dtype(dtype).itemsize
        calls = 1 if iterations(size) == 1 and local == n else CALLS_IN_FLIGHT
        held = {name: held_bytes(alg, size, dtype, processes, me, calls) for name, alg in candidates.items()}
        fixed = buffer_bytes(collective, size, n, local)
        subsets = [list(candidates)] if memory is None else candidate_subsets(list(candidates), held, fixed, memory)
        units += [(i, names, fixed + sum(held[k] for k in names)) for names in subsets]
    parts: list[list[dict[str, list[float]]]] = [[] for _ in cells]
    labels = [cells[i][:2] for i, _, _ in units]
    groups = cell_groups([b for *_, b in units], memory, labels) if memory is not None else [range(len(units))]
    for group in groups:
        chosen = [units[u] for u in group]
        measured = _time_group([(i, cells[i][0], {k: cells[i][2][k] for k in names}, counts[i])
                                for i, names, _ in chosen], mesh, axis, sharding, reps, warmup, passes, dtype, perm,
                               progress)
        for (i, _, _), times in zip(chosen, measured):
            parts[i].append(times)
        gc.collect()  # the group's executables went with its programs, and with them their call sites' memory
    return [merge_subsets(p, list(candidates)) for p, (_, _, candidates) in zip(parts, cells)]


def _time_group(group, mesh, axis, sharding, reps, warmup, passes, dtype, perm, progress):
    """Compile every program of the `group`'s cells ((index, collective, candidates, elements) each), then visit
    the cells `passes` times; each cell's seconds per call of each candidate."""
    import jax

    n = mesh.shape[axis]
    prepared = []
    for i, collective, candidates, count in group:
        iters = iterations(count * np.dtype(dtype).itemsize)
        programs = {name: program(collective, mesh, axis, iters, alg, perm) for name, alg in candidates.items()}
        x = jax.make_array_from_callback((n * count,), sharding,
                                         lambda index, c=count: np.full(n * c, 1e-3, dtype)[index])
        # Compile every program before timing any: a new program's first calls fault in fresh pages.
        for f in programs.values():
            jax.block_until_ready(f(x))
        prepared.append((i, programs, x, iters))
    times = [{name: [] for name in programs} for _, programs, _, _ in prepared]
    for visit in range(passes):
        rounds = reps // passes + (visit < reps % passes)
        for (i, programs, x, iters), out in zip(prepared, times):
            for _ in range(warmup if visit == 0 else 1):
                for f in programs.values():
                    jax.block_until_ready(f(x))
            for _ in range(rounds):
                for name, f in programs.items():
                    t0 = time.perf_counter()
                    jax.block_until_ready(f(x))
                    out[name].append((time.perf_counter() - t0) / iters)
            if progress:
                progress(i)
    return times


def candidate_subsets(names: Sequence[str], held: Mapping[str, int], fixed: int, budget: int) -> list[list[str]]:
    """A cell's candidates (`held[name]`: what each one's call site holds; `fixed`: what the cell's buffers hold,
    whichever runs) in the subsets that are measured together: all of them where they fit in `budget`; else as few
    subsets that fit as first-fit decreasing finds, each led by the first candidate, which ties their times together
    (`merge_subsets`), the others in their order. A pair that alone holds more than the budget is a subset of its
    own."""
    names = list(names)
    if len(names) <= 2 or fixed + sum(held[k] for k in names) <= budget:
        return [names]
    anchor, order = names[0], {name: i for i, name in enumerate(names)}
    subsets: list[list[str]] = []
    room: list[int] = []
    for name in sorted(names[1:], key=lambda k: (-held[k], order[k])):
        fits = next((j for j, left in enumerate(room) if held[name] <= left), None)
        if fits is None:
            subsets.append([])
            room.append(budget - fixed - held[anchor])
            fits = len(subsets) - 1
        subsets[fits].append(name)
        room[fits] -= held[name]
    return [[anchor, *sorted(subset, key=order.get)] for subset in subsets]


def merge_subsets(parts: Sequence[Mapping[str, list[float]]], names: Sequence[str]) -> dict[str, list[float]]:
    """One cell's times from those of its subsets (`candidate_subsets`), in the order of `names`. The subsets ran
    minutes apart, and this machine's speed drifts by that much; every subset timed the first candidate beside its
    others, so each subset's times are scaled by that candidate's median over all of them against its median in
    the subset (the drift a subset shared), and its own samples are all of them together."""
    if len(parts) == 1:
        return {name: list(parts[0][name]) for name in names}
    anchor = names[0]
    overall = statistics.median(t for part in parts for t in part[anchor])
    merged = {anchor: [t for part in parts for t in part[anchor]]}
    for part in parts:
        scale = overall / statistics.median(part[anchor])
        merged.update({name: [t * scale for t in ts] for name, ts in part.items() if name != anchor})
    return {name: merged[name] for name in names}


# A call site keeps a rendezvous (across processes, a call slot) for each of its calls in flight, each with memory
# of its own, and the calls of a loop overlap by one: a rank whose call is done starts the next while the last of
# its peers is still leaving the previous one, and none can finish the next before every rank has left it. Across
# processes a slot is taken again only once every peer has acknowledged its call, which may come after the next
# launch has claimed another. A program of one call a launch, each launch awaited, holds one in one process.
CALLS_IN_FLIGHT = 2


def held_bytes(algorithm, nbytes: int, dtype, processes=None, process: int = 0, calls: int = CALLS_IN_FLIGHT) -> int:
    """Bytes a compiled call site of `algorithm` (a Plan: other algorithms are taken to hold none) keeps in
    process `process` for as long as it lives, at `nbytes` of input per rank, at most: for each of `calls` calls in
    flight, each of the process's ranks' scratch (in the accumulation type) and in-place staging, and where the
    group spans processes (`processes[r]` hosts rank r) the copies of its input and output chunks that its shared
    segment may hold, at most the whole buffers (csrc/communicator.hpp, csrc/cross_process_call.hpp)."""
    from jaxcoll.plan import Plan
    from jaxcoll.plan.collectives import InPlace, definition
    from jaxcoll.sim.machine import chunk_bytes, widen

    if not isinstance(algorithm, Plan):
        return 0
    plan = algorithm
    chunk = chunk_bytes(plan, nbytes)
    spans = processes is not None and len(set(processes)) > 1
    total = 0.0
    for r, prog in enumerate(plan.ranks):
        if spans and processes[r] != process:
            continue
        total += prog.scratch_chunks * chunk * widen(dtype)
        # the input is staged, then the rank's block copied out (csrc/executor.cc, InPlace::kOutputInInput)
        if plan.in_place and definition(plan.collective).in_place is InPlace.OUTPUT_IN_INPUT:
            total += prog.input_chunks * chunk
        if spans:
            total += (prog.input_chunks + prog.output_chunks) * chunk
    return int(calls * total)


def buffer_bytes(collective: str, nbytes: int, nranks: int, local: int) -> int:
    """Bytes a cell holds in this process's XLA buffers while it is measured, whichever candidate runs: its input,
    and one call's outputs (XLA allocates them per call), for `local` of the group's `nranks` ranks."""
    from jaxcoll.plan import Collective
    from jaxcoll.plan.collectives import definition

    ins, outs = definition(Collective(collective)).blocks(nranks)
    return int(local * nbytes * (1 + outs / ins))


# The share of the memory the host has available (and, across processes, of its shared-memory file system's free
# space) that the programs compiled at once may hold, divided among the job's processes on the host.
MEMORY_SHARE = 0.5


def memory_budget(mesh) -> int:
    """Bytes the programs `time_cells` compiles at once may hold in this process: MEMORY_SHARE of the host's
    available memory (/proc/meminfo) and, where the mesh spans processes, of /dev/shm's free space, each divided
    by the mesh's processes on this host. Across a job it is process 0's figure (every process must compile the
    same programs at the same time)."""
    import jax

    from jaxcoll import distributed
    from jaxcoll.tune.calibration import _next_run

    processes = {int(d.process_index) for d in mesh.devices.flat}

    def decide() -> str:
        here = _available_bytes()
        if len(processes) > 1:
            here = min(here, _shm_free_bytes())
            hosts = distributed.layout().hosts
            mine = hosts[jax.process_index()]
            here //= max(1, sum(hosts[p] == mine for p in processes))
        return str(int(here * MEMORY_SHARE))

    if len(processes) == 1:
        return int(decide())
    return int(distributed.agree(f"tune/memory/{_next_run()}", decide))


def cell_groups(held: Sequence[int], budget: int, cells: Sequence | None = None) -> list[list[int]]:
    """The cells' indices in order, in consecutive groups whose `held` bytes add up to at most `budget`; a cell
    that alone holds more is a group of its own, with a warning naming it where `cells` says what each is
    ((collective, bytes))."""
    groups: list[list[int]] = []
    total = 0
    for i, b in enumerate(held):
        if b > budget:
            what = f"{cells[i][0]} at {cells[i][1]} B a rank" if cells is not None else f"cell {i}"
            warnings.warn(f"jaxcoll.tune: the candidates of {what} measured together hold about {b / 2**30:.1f} "
                          f"GiB, more than the {budget / 2**30:.1f} GiB this process may hold at once; they are "
                          f"measured alone, and may still run out of memory (measure smaller sizes)", stacklevel=3)
        if groups and total + b <= budget and b <= budget:
            groups[-1].append(i)
            total += b
        else:
            groups.append([i])
            total = b
    return groups


def _available_bytes() -> int:
    """The host's available memory (MemAvailable), or its total where /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _shm_free_bytes() -> int:
    """Free space of the file system that holds the shared segments (/dev/shm)."""
    try:
        st = os.statvfs("/dev/shm")
        return st.f_bavail * st.f_frsize
    except OSError:
        return _available_bytes()


def median(samples) -> float:
    return statistics.median(samples)
