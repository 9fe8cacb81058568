"""The CUDA executor's cost of a plan: what one call takes on a GPU, from the plan's lanes and a measured model.

The GPU executor is not the CPU runtime (`jaxcoll.sim.machine`, which prices a rank's lanes one after another on
a few threads): every lane of every rank is thread blocks of its own, all resident at once, each walking its
lane's steps (docs/cuda.md, "The kernel"). So a call costs its longest chain of dependent steps, not the sum of
its steps:

    t_call                                   launch, entry and exit (per protocol: bulk adds the rendezvous)
  + the critical path over lanes, where
      a data step costs                      t_step + its bytes read and written / the lane's rate
      a signal, wait or barrier costs        t_sync: the block's barriers and the atomics
      a wait ends                            t_signal after the signal it needs (`need`-th of its semaphore)
      a barrier ends                         when every lane of its rank reached it

and a lane's rate is its blocks' (`blocks_per_lane` x `block_rate`) unless the device's memory is the limit,
shared by every lane of the launch (`device_rate` / lanes). The blocks per lane follow the executor's own rule
(csrc/cuda/launcher.cc, `wanted_blocks_per_lane`), capped so the launch's blocks are all resident: a plan with
many lanes gets fewer blocks per lane, which is what makes a many-lane plan slow at large sizes on one GPU.

The constants are measured on the GPU at hand: benchmarks/cuda.py's tune part fits them, per protocol, to the
shifts and the simplest plans of each collective (`fit`), then prices every built-in and synthesized plan.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from jaxcoll.plan import Op, Plan

THREADS = 512  # an executor block's threads (csrc/cuda/kernel_params.hpp, kThreads)
MAX_BLOCKS_PER_LANE = 32  # a semaphore counts one signal per block of a lane (kMaxBlocksPerLane)
MAX_PACKET_BLOCKS = 16  # packets: blocks per lane by default at most (kMaxPacketBlocks)
MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class GpuModel:
    """Measured constants of the CUDA executor on one GPU and protocol (seconds, bytes per second)."""

    call_s: float = 8e-6
    step_s: float = 1e-6  # a data step, before its bytes: reading it, working out its operands, its barriers
    sync_s: float = 1e-6  # a signal, wait or barrier step: its barriers and atomics
    block_rate: float = 30e9  # bytes read + written a second by one thread block
    device_rate: float = 3e12  # bytes read + written a second by the whole device
    signal_s: float = 1e-6  # a signal's way to the waiting block
    resident_blocks: int = 264  # executor blocks one launch holds at once (2 a multiprocessor on 132)

    NAMES = ("call_s", "step_s", "sync_s", "block_rate", "device_rate", "signal_s")

    def constants(self) -> np.ndarray:
        return np.array([getattr(self, n) for n in self.NAMES])

    def with_constants(self, values: Sequence[float]) -> GpuModel:
        return dataclasses.replace(self, **{n: float(v) for n, v in zip(self.NAMES, values)})


def lanes_of(plan: Plan) -> int:
    """The most lanes of any rank (a rank without lanes still runs one, empty)."""
    return max(max(len(prog.lanes), 1) for prog in plan.ranks)


def blocks_per_lane(plan: Plan, input_elements: int, output_elements: int, itemsize: int, protocol: str,
                    launch_ranks: int, resident_blocks: int) -> int:
    """The executor's blocks per lane for a call (csrc/cuda/launcher.cc: `wanted_blocks_per_lane`, then capped so
    `launch_ranks` x lanes x blocks are resident). ValueError where even one block per lane does not fit."""
    if protocol not in ("ll", "bulk"):
        raise ValueError(f"blocks_per_lane: protocol must be 'll' or 'bulk', got {protocol!r}")
    lanes = lanes_of(plan)
    most = resident_blocks // (launch_ranks * lanes)
    if most < 1:
        raise ValueError(f"blocks_per_lane: {launch_ranks} ranks x {lanes} lanes need more blocks resident than "
                         f"the device's {resident_blocks}")
    if protocol == "ll":
        elements = max(input_elements, output_elements) // lanes
        want = min(max(-(-elements // THREADS), 1), MAX_PACKET_BLOCKS)
    else:
        per_lane = input_elements * itemsize // lanes
        want = min(max(-(-per_lane // MiB), 1), MAX_BLOCKS_PER_LANE)
    return min(want, most)


@dataclasses.dataclass(frozen=True)
class Path:
    """A plan's steps as the GPU executor runs them, before any constant: per lane, each step's kind, its bytes in
    chunks (read + written) and, for a wait, how many signals of its semaphore it needs."""

    lanes: tuple[tuple[tuple[str, float, tuple[int, int] | None, int], ...], ...]  # (kind, chunks, (rank, sem), need)
    lane_rank: tuple[int, ...]


def path(plan: Plan) -> Path:
    """The plan's lanes as `critical_path` walks them. Linear in the plan's steps."""
    lanes, lane_rank = [], []
    for r, prog in enumerate(plan.ranks):
        for lane in prog.lanes:
            waits: dict[int, int] = defaultdict(int)
            steps = []
            for step in lane.steps:
                if step.op is Op.WAIT:
                    waits[step.sem] += 1
                    steps.append(("wait", 0.0, (r, step.sem), waits[step.sem]))
                elif step.op is Op.SIGNAL:
                    steps.append(("signal", 0.0, (step.peer, step.sem), 0))
                elif step.op is Op.BARRIER:
                    steps.append(("barrier", 0.0, None, 0))
                else:
                    refs = step.dsts if step.op is Op.ZERO else step.srcs + step.dsts
                    steps.append(("data", float(sum(ref.count for ref in refs)), None, 0))
            lanes.append(tuple(steps))
            lane_rank.append(r)
    return Path(tuple(lanes), tuple(lane_rank))


def critical_path(p: Path, step_s: float, chunk_s: float, signal_s: float, sync_s: float) -> float:
    """Seconds from the first step of the call to its last: every lane from time 0, each data step `step_s`
    plus `chunk_s` a chunk, each signal, wait and barrier `sync_s`, a wait until the `need`-th signal of its
    semaphore has landed (a signal lands `signal_s` after it is sent), a barrier until every lane of its rank
    reached it or finished (the executor counts a finished lane as arrived). Lanes run in time order wherever
    they touch another lane, so signals land in the order they are sent."""
    n = len(p.lanes)
    pc = [0] * n
    clock = [0.0] * n
    landed: dict[tuple[int, int], list[float]] = defaultdict(list)  # arrival times, sorted
    blocked: dict[tuple[int, int], list[int]] = defaultdict(list)  # lanes waiting on a semaphore
    at_barrier: dict[tuple[int, int], list[int]] = defaultdict(list)  # (rank, k-th barrier) -> lanes there
    lanes_of_rank: dict[int, int] = defaultdict(int)
    finished: dict[int, int] = defaultdict(int)
    for r in p.lane_rank:
        lanes_of_rank[r] += 1
    seen_barriers = [0] * n
    ready = [(0.0, i) for i in range(n)]
    heapq.heapify(ready)
    end = 0.0

    def release_barrier(key) -> None:
        there = at_barrier[key]
        if len(there) + finished[key[0]] < lanes_of_rank[key[0]] or not there:
            return
        t = max(clock[j] for j in there)
        for j in there:
            heapq.heappush(ready, (t, j))
        there.clear()

    while ready:
        t, i = heapq.heappop(ready)
        steps = p.lanes[i]
        while pc[i] < len(steps):
            kind, chunks, sem, need = steps[pc[i]]
            if kind != "data" and ready and ready[0][0] < t:
                heapq.heappush(ready, (t, i))  # an earlier lane first: it may signal what this one needs
                break
            if kind == "wait":
                arrivals = landed[sem]
                if len(arrivals) < need:
                    blocked[sem].append(i)
                    clock[i] = t
                    break
                t = max(t, arrivals[need - 1]) + sync_s
            elif kind == "signal":
                t += sync_s
                bisect.insort(landed[sem], t + signal_s)
                for j in blocked.pop(sem, ()):
                    heapq.heappush(ready, (max(clock[j], t + signal_s), j))
            elif kind == "barrier":
                key = (p.lane_rank[i], seen_barriers[i])
                seen_barriers[i] += 1
                pc[i] += 1
                clock[i] = t + sync_s
                at_barrier[key].append(i)
                release_barrier(key)
                break
            else:
                t += step_s + chunks * chunk_s
            pc[i] += 1
        else:
            end = max(end, t)
            r = p.lane_rank[i]
            finished[r] += 1
            for key in [k for k in at_barrier if k[0] == r]:
                release_barrier(key)
    stuck = [i for i in range(n) if pc[i] < len(p.lanes[i])]
    if stuck:
        raise ValueError(f"critical_path: lane {stuck[0]} never finishes (a wait no signal satisfies)")
    return end


def seconds(plan: Plan, input_bytes: float, model: GpuModel, protocol: str, itemsize: int = 4,
            launch_ranks: int | None = None, p: Path | None = None) -> float:
    """Seconds a call of `plan` with `input_bytes` a rank takes on the GPU `model` describes, all of its ranks in
    one launch (the emulated harness; `launch_ranks` = 1: one GPU a rank)."""
    elements = int(input_bytes) // itemsize
    block = max(elements // plan.in_blocks, 1)
    launch_ranks = plan.nranks if launch_ranks is None else launch_ranks
    b = blocks_per_lane(plan, block * plan.in_blocks, block * plan.out_blocks, itemsize, protocol, launch_ranks,
                        model.resident_blocks)
    lanes = launch_ranks * lanes_of(plan)
    rate = min(b * model.block_rate, model.device_rate / lanes)
    chunk = block * itemsize / plan.chunk_factor
    return model.call_s + critical_path(p or path(plan), model.step_s, chunk / rate, model.signal_s, model.sync_s)


def fit(start: GpuModel, cells: Sequence[tuple[Plan, float, str]], times: Sequence[float]) -> GpuModel:
    """The constants that best predict `times` (seconds) of `cells` ((plan, input bytes, protocol)), in relative
    error: least squares on log(predicted / measured) over the constants' logarithms, from `start`."""
    from scipy.optimize import least_squares

    paths = [path(plan) for plan, _, _ in cells]
    measured = np.log(np.asarray(times, dtype=float))

    def residuals(x):
        model = start.with_constants(np.exp(x))
        return np.array([math.log(seconds(plan, nbytes, model, protocol, p=pp))
                         for (plan, nbytes, protocol), pp in zip(cells, paths)]) - measured

    x0 = np.log(start.constants())
    result = least_squares(residuals, x0, method="trf", x_scale=1.0, diff_step=1e-3, max_nfev=400)
    return start.with_constants(np.exp(result.x))
