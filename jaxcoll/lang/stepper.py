"""Lanes stepping through their steps under the executor's synchronisation contract: the one interpreter of
semaphores and barriers that the checker's schedule, the picture's rounds and the MSCCL++ export's tests share.

The contract (docs/plan-ir.md): every lane starts at its first step with every semaphore at zero; a signal adds
one to a semaphore; a wait takes one from each semaphore it names and cannot complete until each holds one; the
lanes that meet at a barrier complete it together, when the last of them arrives. What a data step computes,
and which lane steps next, is the caller's business: the stepper only says which lanes can step and moves them.

Lanes and semaphores are named by any hashable key, so the same stepper runs a Plan (`for_plan`) and a file
of another format whose operations the caller describes with `Sync` (tests/test_mscclpp_export.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence

from jaxcoll.plan.ir import Op, Plan


class Sync:
    """What one step does to the synchronisation state. A data step does nothing to it (`DATA`)."""

    __slots__ = ("waits", "signals", "barrier", "parties")

    def __init__(self, waits: Sequence[Hashable] = (), signals: Sequence[Hashable] = (),
                 barrier: Hashable | None = None, parties: int = 0):
        self.waits = tuple(Counter(waits).items())  # (semaphore, signals the step takes from it)
        self.signals = tuple(signals)  # semaphores the step adds one signal to
        self.barrier = barrier  # the barrier the step meets at (None: none) ...
        self.parties = parties  # ... and how many lanes meet there


DATA = Sync()


class Stepper:
    """The state of lanes part-way through their steps: where each lane is, the signals each semaphore holds,
    and which lanes wait at a barrier.

    `lanes` maps a lane's key to its steps; `sync(key, step)` says what a step of that lane does to the
    synchronisation state. A step is named by (lane key, position in the lane)."""

    def __init__(self, lanes: Mapping[Hashable, Sequence], sync: Callable[[Hashable, object], Sync]):
        self.lanes = lanes
        self.sync = sync
        self.pc = {key: 0 for key in lanes}  # lane -> position of its next step
        # lane -> what its next step does (None: it has finished); each step's is asked for once, as the
        # checker steps plans of 10^5-10^6 steps
        self.ahead = {key: sync(key, steps[0]) if steps else None for key, steps in lanes.items()}
        self.signals: dict[Hashable, int] = {}  # semaphore -> signals it holds
        self.arrived: dict[Hashable, list] = {}  # barrier -> lanes waiting there, in order of arrival

    def next_sync(self, key) -> Sync | None:
        """What the lane's next step does to the synchronisation state (None: the lane has finished)."""
        return self.ahead[key]

    def blocked(self, key) -> bool:
        """Whether the lane cannot step now: it has finished, waits at a barrier, or its next step waits on a
        semaphore that holds too few signals."""
        s = self.ahead[key]
        if s is DATA:
            return False
        if s is None:
            return True
        if s.barrier is not None:
            return key in self.arrived.get(s.barrier, ())
        return not self._signalled(s)

    def _signalled(self, s: Sync) -> bool:
        """Whether every semaphore that `s` waits on holds the signals it takes."""
        held = self.signals
        for sem, n in s.waits:
            if held.get(sem, 0) < n:
                return False
        return True

    def step(self, key) -> list[tuple]:
        """Run the lane's next step; return the steps that complete, as (lane key, position): this one, or at a
        barrier nothing until the last lane arrives and then every lane's barrier step, in order of lane key.
        A blocked lane does nothing."""
        return self.run(key, steps=1)

    def run(self, key, *, steps: int = -1, data_steps: int = -1) -> list[tuple]:
        """Run the lane until it is blocked, has run `steps` steps or would start data step number
        `data_steps` + 1 (-1: no limit); return the steps that complete, in order, as `step` does."""
        s = self.ahead[key]
        if s is None:
            return []
        done: list[tuple] = []
        lane, sync, held = self.lanes[key], self.sync, self.signals
        pc, end = self.pc[key], len(lane)
        taken = data = 0
        while s is not None and taken != steps:
            if s is DATA:
                if data == data_steps:
                    break
                data += 1
                done.append((key, pc))
            elif s.barrier is not None:
                here = self.arrived.setdefault(s.barrier, [])
                if key in here:
                    break
                here.append(key)
                if len(here) < s.parties:
                    break
                del self.arrived[s.barrier]
                self.pc[key] = pc
                done += sorted((k, self.pc[k]) for k in here)
                for k in here:
                    if k != key:
                        self._advance(k)
            else:
                if not self._signalled(s):
                    break
                for sem, n in s.waits:
                    held[sem] -= n
                for sem in s.signals:
                    held[sem] = held.get(sem, 0) + 1
                done.append((key, pc))
            pc += 1
            taken += 1
            s = sync(key, lane[pc]) if pc < end else None
        self.pc[key], self.ahead[key] = pc, s
        return done

    def _advance(self, key) -> None:
        pc = self.pc[key] = self.pc[key] + 1
        steps = self.lanes[key]
        self.ahead[key] = self.sync(key, steps[pc]) if pc < len(steps) else None

    def unfinished(self) -> list[tuple]:
        """The next step of every lane that has not finished, as (lane key, position)."""
        return [(key, pc) for key, pc in self.pc.items() if pc < len(self.lanes[key])]


def for_plan(plan: Plan) -> Stepper:
    """A stepper over the lanes of `plan`, keyed (rank, lane) in rank-major order; its semaphores are (rank,
    semaphore) and the lanes of a rank share its barriers."""
    lanes = {(r, l): lane.steps for r, prog in enumerate(plan.ranks) for l, lane in enumerate(prog.lanes)}
    nlanes = [len(prog.lanes) for prog in plan.ranks]
    known: dict[tuple, Sync] = {}  # a plan names few semaphores: one Sync serves every step on one
    WAIT, SIGNAL, BARRIER = Op.WAIT, Op.SIGNAL, Op.BARRIER

    def sync(key, step) -> Sync:
        op = step.op
        if op is WAIT:
            what = (op, key[0], step.sem)
        elif op is SIGNAL:
            what = (op, step.peer, step.sem)
        elif op is BARRIER:
            what = (op, key[0])
        else:
            return DATA
        s = known.get(what)
        if s is None:
            if op is WAIT:
                s = Sync(waits=(what[1:],))
            elif op is SIGNAL:
                s = Sync(signals=(what[1:],))
            else:
                s = Sync(barrier=key[0], parties=nlanes[key[0]])
            known[what] = s
        return s

    return Stepper(lanes, sync)
