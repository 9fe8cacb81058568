"""The plan IR: the one contract shared by the language, the synthesizers, the lowering and the runtimes.

A plan is a per-rank program of chunk moves, reductions and synchronisations (docs/plan-ir.md). It names its
collective and group size; each rank declares how many chunks its input, output and scratch buffers hold and
runs one or more lanes, each an ordered list of steps. Byte offsets are not part of a plan: they follow from the
message size at run time (see `jaxcoll.plan.layout`), so one plan serves every size.

Every data step has the same meaning, whatever its op: the values of its source chunks are reduced, in the
order listed, with the call's reduction (sum, max or min) and the result is written to every destination chunk.
A single source is a plain copy. The op names what the step is for (and how a GPU lane executes it); the
runtime's meaning does not depend on it beyond the checks in `Step.__post_init__`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterable, Sequence
from typing import Any

from jaxcoll.plan.collectives import COLLECTIVE_CODES, ZERO, Collective, definition  # noqa: F401 (re-exported)
from jaxcoll.plan.errors import PlanError


class Buffer(str, enum.Enum):
    """The buffers a step can address on a rank. Scratch holds the accumulation type (float32 for 16-bit
    floats), so partial sums that travel through scratch are rounded once, at their final destination."""

    INPUT = "input"
    OUTPUT = "output"
    SCRATCH = "scratch"


class Op(str, enum.Enum):
    """Step kinds. Data ops write reduce(srcs) to every dst; sync ops order lanes and ranks."""

    COPY = "copy"  # local: one local src, one local dst
    REDUCE = "reduce"  # local: dst <- dst (+) src, written as srcs=(dst, src)
    PUT = "put"  # write local chunk(s) into a peer's buffer
    GET = "get"  # read a peer's chunk into a local buffer
    READ_REDUCE = "read_reduce"  # reduce peers' (and local) chunks into local chunk(s)
    REDUCE_PUT = "reduce_put"  # fused: reduce, then write to peers (and optionally locally)
    READ_REDUCE_PUT = "read_reduce_put"  # fused: read-reduce peers' chunks, write to peers and locally
    ZERO = "zero"  # fill dsts with zeros (ppermute outputs nobody sends to)
    SIGNAL = "signal"  # increment semaphore `sem` of rank `peer` (release)
    WAIT = "wait"  # consume one signal of this rank's semaphore `sem` (acquire); blocks until one arrives
    BARRIER = "barrier"  # every lane of this rank reaches this point before any goes on

    @property
    def is_data(self) -> bool:
        return self not in (Op.SIGNAL, Op.WAIT, Op.BARRIER)


# Wire codes: stable integers used by the serialized form and the C++/CUDA executors. Never renumber. The
# collectives' (COLLECTIVE_CODES) are written in their table, jaxcoll.plan.collectives.
OP_CODES = {op: i for i, op in enumerate(Op)}
BUFFER_CODES = {buf: i for i, buf in enumerate(Buffer)}

# Steps and refs are the bulk of a plan (a synthesized plan of 16 ranks holds 100k-200k of each): they are slotted
# (half the objects for the garbage collector to scan, faster field access), and the unchecked constructors set
# a frozen instance's fields through the slots' own setters (`_slot_setters`), without the generated __init__'s
# object.__setattr__ by name and __post_init__.
_new = object.__new__


def _slot_setters(cls) -> tuple:
    """The setters of a slotted dataclass's slots, in the order of its fields."""
    return tuple(cls.__dict__[f.name].__set__ for f in dataclasses.fields(cls))


@dataclasses.dataclass(frozen=True, slots=True)
class ChunkRef:
    """`count` consecutive chunks, starting at `index`, of buffer `buffer` on rank `rank`."""

    rank: int
    buffer: Buffer
    index: int
    count: int = 1

    def __post_init__(self):
        if type(self.buffer) is not Buffer:  # converting a member through the enum costs more than the rest
            object.__setattr__(self, "buffer", Buffer(self.buffer))
        if self.count < 1:
            raise PlanError(f"chunk count must be >= 1, got count={self.count} in {self}")
        if self.index < 0:
            raise PlanError(f"chunk index must be >= 0, got index={self.index} in {self}")

    @classmethod
    def unchecked(cls, rank: int, buffer: Buffer, index: int, count: int = 1) -> "ChunkRef":
        """A ref from fields already in canonical form (`buffer` a `Buffer`), without the checks of the
        constructor: for synthesizers that build many refs that are well formed by construction. `validate`
        repeats every check on the plan they end up in."""
        ref = _new(cls)
        set_rank, set_buffer, set_index, set_count = _REF_SETTERS
        set_rank(ref, rank)
        set_buffer(ref, buffer)
        set_index(ref, index)
        set_count(ref, count)
        return ref

    def indices(self) -> range:
        return range(self.index, self.index + self.count)

    def to_json(self) -> list:
        return [self.rank, self.buffer.value, self.index, self.count]

    @classmethod
    def from_json(cls, v: Sequence) -> "ChunkRef":
        return cls(int(v[0]), Buffer(v[1]), int(v[2]), int(v[3]) if len(v) > 3 else 1)

    def __repr__(self) -> str:
        span = f"{self.index}" if self.count == 1 else f"{self.index}:{self.index + self.count}"
        return f"r{self.rank}.{self.buffer.value}[{span}]"


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One instruction of a lane. See `Op` for what each kind means."""

    op: Op
    srcs: tuple[ChunkRef, ...] = ()
    dsts: tuple[ChunkRef, ...] = ()
    peer: int = -1  # SIGNAL: the rank whose semaphore is incremented
    sem: int = -1  # SIGNAL / WAIT: semaphore index on the receiving rank
    # Data steps that reach a peer: the connection (MSCCL channel, MSCCL++ memory channel) of the pair of ranks
    # the transfer uses; -1 is "none named". The executors do not need it (the serialized form leaves it out);
    # the checker keeps one channel to one lane of the sending rank, and the file formats carry it.
    channel: int = -1

    def __post_init__(self):
        if type(self.op) is not Op:
            object.__setattr__(self, "op", Op(self.op))
        if type(self.srcs) is not tuple:
            object.__setattr__(self, "srcs", tuple(self.srcs))
        if type(self.dsts) is not tuple:
            object.__setattr__(self, "dsts", tuple(self.dsts))
        op = self.op
        if op.is_data:
            if not self.dsts:
                raise PlanError(f"{op.value} step needs at least one destination chunk: {self}")
            if op is Op.ZERO:
                if self.srcs:
                    raise PlanError(f"zero step takes no sources: {self}")
            elif not self.srcs:
                raise PlanError(f"{op.value} step needs at least one source chunk: {self}")
            count = self.dsts[0].count
            if any(r.count != count for r in self.srcs + self.dsts):
                counts = {r.count for r in self.srcs + self.dsts}
                raise PlanError(f"{op.value} step mixes chunk counts {sorted(counts)}: {self}")
        else:
            if self.srcs or self.dsts:
                raise PlanError(f"{op.value} step moves no data but names chunks: {self}")
            if op in (Op.SIGNAL, Op.WAIT) and self.sem < 0:
                raise PlanError(f"{op.value} step needs a semaphore index >= 0, got sem={self.sem}")
            if op is Op.SIGNAL and self.peer < 0:
                raise PlanError(f"signal step needs a peer rank >= 0, got peer={self.peer}")
            if self.channel != -1:
                raise PlanError(f"{op.value} step moves no data but names channel={self.channel}")
        if self.channel < -1:
            raise PlanError(f"channel must be >= 0 (or -1 for none), got channel={self.channel} in {self}")

    @classmethod
    def unchecked(cls, op: Op, srcs: tuple[ChunkRef, ...] = (), dsts: tuple[ChunkRef, ...] = (), peer: int = -1,
                  sem: int = -1, channel: int = -1) -> "Step":
        """A step from fields already in canonical form (`op` an `Op`, tuples of refs), without the checks of
        the constructor: for synthesizers that build many steps that are well formed by construction.
        `validate` repeats every check on the plan they end up in."""
        step = _new(cls)
        set_op, set_srcs, set_dsts, set_peer, set_sem, set_channel = _STEP_SETTERS
        set_op(step, op)
        set_srcs(step, srcs)
        set_dsts(step, dsts)
        set_peer(step, peer)
        set_sem(step, sem)
        set_channel(step, channel)
        return step

    def to_json(self) -> dict:
        d: dict[str, Any] = {"op": self.op.value}
        if self.srcs:
            d["srcs"] = [r.to_json() for r in self.srcs]
        if self.dsts:
            d["dsts"] = [r.to_json() for r in self.dsts]
        if self.op is Op.SIGNAL:
            d["peer"] = self.peer
        if self.op in (Op.SIGNAL, Op.WAIT):
            d["sem"] = self.sem
        if self.channel >= 0:
            d["channel"] = self.channel
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Step":
        return cls(
            Op(d["op"]),
            tuple(ChunkRef.from_json(r) for r in d.get("srcs", ())),
            tuple(ChunkRef.from_json(r) for r in d.get("dsts", ())),
            int(d.get("peer", -1)),
            int(d.get("sem", -1)),
            int(d.get("channel", -1)),
        )

    def __repr__(self) -> str:
        if self.op is Op.SIGNAL:
            return f"signal(r{self.peer}.sem{self.sem})"
        if self.op is Op.WAIT:
            return f"wait(sem{self.sem})"
        if self.op is Op.BARRIER:
            return "barrier()"
        ch = f" @ch{self.channel}" if self.channel >= 0 else ""
        return f"{self.op.value}({', '.join(map(repr, self.srcs))} -> {', '.join(map(repr, self.dsts))}{ch})"


_REF_SETTERS = _slot_setters(ChunkRef)
_STEP_SETTERS = _slot_setters(Step)


@dataclasses.dataclass(frozen=True)
class Lane:
    """An ordered list of steps run by one worker of a rank (a CPU worker, a GPU thread block)."""

    steps: tuple[Step, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "steps", tuple(self.steps))


@dataclasses.dataclass(frozen=True)
class RankProgram:
    """What one rank runs: its buffers' chunk counts, its semaphore count and its lanes."""

    input_chunks: int
    output_chunks: int
    scratch_chunks: int = 0
    semaphores: int = 0
    lanes: tuple[Lane, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "lanes", tuple(self.lanes))

    def chunks(self, buffer: Buffer) -> int:
        return {Buffer.INPUT: self.input_chunks, Buffer.OUTPUT: self.output_chunks,
                Buffer.SCRATCH: self.scratch_chunks}[Buffer(buffer)]


# The reductions a call can apply, in the order of their codes (jaxcoll.plan.abi.REDUCE_OP_CODES).
REDUCE_OPS = ("sum", "max", "min")


@dataclasses.dataclass(frozen=True)
class Expect:
    """The postcondition of a custom plan, stated in the plan file so the plan can be proved from the file alone.

    `outputs[r][i]` says what output chunk i of rank r must hold at exit: None (anything: the chunk is not part
    of the result), or the *contributions* reduced into it, each a term (rank, input chunk index) meaning that
    chunk of that rank's input as it was at entry, or ZERO for zeros. One term is a copy; several are their
    reduction with the call's op; a term listed twice must be reduced in twice. `reduce_op` is the reduction
    the postcondition is stated for: "sum" counts every term with its multiplicity (a plan proved for sum is
    right for max and min too); for "max" and "min", which forgive duplicates, only the set of terms must match
    and the plan must only ever be run with that op. The executors never see it (not in the serialized form).
    """

    outputs: tuple[tuple[tuple | None, ...], ...]
    reduce_op: str = "sum"

    def __post_init__(self):
        def term(t) -> tuple:
            if t == ZERO[0] or t == ZERO:
                return ZERO
            if not isinstance(t, (tuple, list)) or len(t) != 2:
                raise PlanError(f"expect: a contribution is [rank, input chunk] or \"zero\", got {t!r}")
            return int(t[0]), int(t[1])

        def chunk(v):
            if v is None:
                return None
            if not isinstance(v, (tuple, list)):
                raise PlanError(f"expect: an output chunk lists its contributions, got {v!r}")
            return tuple(sorted(map(term, v), key=lambda t: (t == ZERO, t)))

        object.__setattr__(self, "outputs", tuple(tuple(chunk(v) for v in row) for row in self.outputs))
        if self.reduce_op not in REDUCE_OPS:
            raise PlanError(f"expect: reduce_op={self.reduce_op!r}, expected one of {list(REDUCE_OPS)}")

    def to_json(self) -> dict:
        def term(t):
            return t[0] if t == ZERO else list(t)
        return {"reduce_op": self.reduce_op,
                "outputs": [[None if v is None else [term(t) for t in v] for v in row] for row in self.outputs]}

    @classmethod
    def from_json(cls, d: dict) -> "Expect":
        return cls(tuple(tuple(row) for row in d["outputs"]), d.get("reduce_op", "sum"))


def default_blocks(collective: Collective, nranks: int) -> tuple[int, int]:
    """(input blocks, output blocks) of a collective: how many equal, independent blocks of the per-rank
    message each buffer holds (its table entry, `jaxcoll.plan.collectives`). Chunks subdivide blocks (see
    `jaxcoll.plan.layout`). PlanError for a collective the table does not know."""
    return definition(collective).blocks(nranks)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A complete collective algorithm for a group of `nranks` ranks.

    `in_place` means the input lives inside the output buffer, as in MSCCL: for all_gather rank r's input is
    output block r, for reduce_scatter rank r's output is input block r, otherwise input and output coincide.
    A plan written for in-place execution reads "input" chunks at those output positions.
    """

    collective: Collective
    nranks: int
    ranks: tuple[RankProgram, ...]
    name: str = ""
    in_place: bool = False
    in_blocks: int = 0  # 0: the collective's default (see default_blocks); a custom plan states its own
    out_blocks: int = 0
    protocol: str = "auto"  # "ll" (packets), "simple" (bulk) or "auto"; the GPU executor reads it
    # What the collective is, beyond its kind: the checker states postconditions with these. The executor does
    # not need them (the steps say everything), so the serialized form leaves them out.
    root: int = 0  # broadcast: the rank whose input every rank receives
    perm: tuple[tuple[int, int], ...] = ()  # ppermute: (source, destination) pairs, as in lax.ppermute
    expect: Expect | None = None  # custom: the postcondition (a built-in collective's follows from its kind)

    def __post_init__(self):
        object.__setattr__(self, "collective", Collective(self.collective))
        object.__setattr__(self, "ranks", tuple(self.ranks))
        object.__setattr__(self, "perm", tuple((int(a), int(b)) for a, b in self.perm))
        if self.nranks < 1:
            raise PlanError(f"plan needs nranks >= 1, got nranks={self.nranks}")
        if len(self.ranks) != self.nranks:
            raise PlanError(f"plan for nranks={self.nranks} has {len(self.ranks)} rank programs")
        if self.expect is not None and not definition(self.collective).plan_states:
            raise PlanError(f"expect is the postcondition of a custom plan; a {self.collective.value} plan's "
                            f"postcondition follows from its collective (and root or perm)")
        din, dout = default_blocks(self.collective, self.nranks)
        if self.in_blocks == 0:
            object.__setattr__(self, "in_blocks", din)
        if self.out_blocks == 0:
            object.__setattr__(self, "out_blocks", dout)

    # -- structure -------------------------------------------------------------------------------------------
    @property
    def chunk_factor(self) -> int:
        """Chunks per block, k: every buffer's chunk count is a multiple of it (checked by validate)."""
        return self.ranks[0].input_chunks // self.in_blocks if self.ranks else 1

    def steps(self) -> Iterable[tuple[int, int, int, Step]]:
        """Every step of the plan as (rank, lane, position, step)."""
        for r, prog in enumerate(self.ranks):
            for l, lane in enumerate(prog.lanes):
                for i, step in enumerate(lane.steps):
                    yield r, l, i, step

    def num_steps(self) -> int:
        return sum(len(lane.steps) for prog in self.ranks for lane in prog.lanes)

    def elements_for_bytes(self, nbytes: int, itemsize: int) -> tuple[int, int]:
        """(input, output) elements of a rank whose larger buffer holds at most `nbytes` of `itemsize`-byte
        elements, the input a whole number of the plan's in_blocks: sizes as the benchmarks and the GPU round
        quote them (256 MiB per rank: 256 MiB in and out for all_reduce, 32 MiB in and 256 MiB out for an 8-rank
        all_gather). ValueError when `nbytes` holds no block."""
        block = nbytes // itemsize // max(self.in_blocks, self.out_blocks)
        if block < 1:
            raise ValueError(f"elements_for_bytes: {nbytes} bytes hold no block of the plan's "
                             f"{max(self.in_blocks, self.out_blocks)} chunks of {itemsize}-byte elements")
        return block * self.in_blocks, block * self.out_blocks

    # -- files -----------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        d = {
            "format": "jaxcoll.plan/1",
            "name": self.name,
            "collective": self.collective.value,
            "nranks": self.nranks,
            "in_place": self.in_place,
            "in_blocks": self.in_blocks,
            "out_blocks": self.out_blocks,
            "protocol": self.protocol,
            "root": self.root,
            "perm": [list(p) for p in self.perm],
            "ranks": [
                {
                    "input_chunks": p.input_chunks,
                    "output_chunks": p.output_chunks,
                    "scratch_chunks": p.scratch_chunks,
                    "semaphores": p.semaphores,
                    "lanes": [[s.to_json() for s in lane.steps] for lane in p.lanes],
                }
                for p in self.ranks
            ],
        }
        if self.expect is not None:
            d["expect"] = self.expect.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        try:
            return cls(
                collective=Collective(d["collective"]),
                nranks=int(d["nranks"]),
                name=d.get("name", ""),
                in_place=bool(d.get("in_place", False)),
                in_blocks=int(d.get("in_blocks", 0)),
                out_blocks=int(d.get("out_blocks", 0)),
                protocol=d.get("protocol", "auto"),
                root=int(d.get("root", 0)),
                perm=tuple(tuple(p) for p in d.get("perm", ())),
                expect=Expect.from_json(d["expect"]) if d.get("expect") is not None else None,
                ranks=tuple(
                    RankProgram(
                        int(p["input_chunks"]),
                        int(p["output_chunks"]),
                        int(p.get("scratch_chunks", 0)),
                        int(p.get("semaphores", 0)),
                        tuple(Lane(tuple(Step.from_json(s) for s in lane)) for lane in p["lanes"]),
                    )
                    for p in d["ranks"]
                ),
            )
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, PlanError):
                raise
            raise PlanError(f"malformed plan file: {type(e).__name__}: {e}") from e

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> "Plan":
        return cls.from_json(json.loads(text))

    def save(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def load(cls, path) -> "Plan":
        with open(path) as f:
            return cls.from_json(json.load(f))

    def __repr__(self) -> str:
        return (f"Plan({self.name or self.collective.value}, nranks={self.nranks}, "
                f"steps={self.num_steps()}, in_place={self.in_place})")
