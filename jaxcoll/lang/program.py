"""Writing a plan like the algorithm on a whiteboard: take a chunk, copy it to a rank, reduce it there.

    with program("ring", "all_reduce", nranks=4, chunks=4) as p:
        c = chunk(0, "input", 1)
        c = c.copy(1, "scratch", 1)
        chunk(1, "input", 1).reduce(c)
    plan = p.plan()

A program records *operations* in the order it is written (the sequential meaning of the program: as if one
rank ran them all, one after another). `plan()` compiles them (`jaxcoll.lang.compiler`) into a Plan whose
lanes run concurrently, with exactly the signals and waits the sequential order needs, and checks it.

Buffers are "input", "output", "scratch" (or "i", "o", "s"), or any other name: a named scratch buffer, laid out
by the compiler inside the rank's scratch. Who executes an operation: a copy runs on the source rank (a put)
unless `via="get"`; a reduce runs on the destination rank, reading the source from its peer if need be.

Lanes, channels and semaphores are assigned by the compiler; each operation may name its own (the rest are
still assigned around it), as `ch=`, `sendtb=` and `recvtb=` do in MSCCLang:
- `lane=l`: the lane of the executing rank that runs the operation;
- `channel=c`: the connection of the two ranks the transfer uses (MSCCL's `chan`, an MSCCL++ memory channel);
  operations on different channels of a pair run on different lanes, so the channels proceed in parallel;
- `sem=s`: the semaphore of the executing rank on which the operation waits for the steps it depends on (the
  compiler sends their signals there). Sharing one semaphore among several operations or peers saves
  semaphores ("every peer signals, then wait for all of them"); the checker proves that every wait still
  consumes the signal it is meant to, and rejects the program otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jaxcoll.lang import named_scratch
from jaxcoll.lang.compiler import Instr, compile_program
from jaxcoll.plan.collectives import definition
from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.ir import Buffer, ChunkRef, Collective, Op, Plan, Step, default_blocks

_BUFFERS = {"input": "input", "in": "input", "i": "input", "output": "output", "out": "output", "o": "output",
            "scratch": "scratch", "s": "scratch"}

_current: list["Program"] = []


@dataclasses.dataclass(frozen=True)
class Chunk:
    """`size` consecutive chunks of buffer `buffer` on rank `rank`, starting at `index`."""

    prog: "Program"
    rank: int
    buffer: str
    index: int
    size: int = 1

    def copy(self, dst_rank: int, buffer: str, index: int, *, lane: int | None = None,
             channel: int | None = None, sem: int | None = None, via: str = "put") -> "Chunk":
        """Write this chunk to `buffer[index]` of `dst_rank`; returns the destination chunk. `via="put"` runs
        the step on this chunk's rank, `via="get"` on the destination's. `lane`, `channel` and `sem` override
        the compiler's choice for this operation (see the module docstring)."""
        dst = self.prog._chunk(dst_rank, buffer, index, self.size)
        if via not in ("put", "get"):
            raise PlanError(f"copy via={via!r}: expected 'put' or 'get'")
        executor = self.rank if via == "put" else dst_rank
        op = Op.COPY if self.rank == dst_rank else (Op.PUT if via == "put" else Op.GET)
        self.prog._record(executor, Step(op, (self._ref(),), (dst._ref(),)), lane, channel, sem,
                          what=f"{self!r}.copy({dst!r})")
        return dst

    def reduce(self, other: "Chunk", *, lane: int | None = None, channel: int | None = None,
               sem: int | None = None) -> "Chunk":
        """self <- self (+) other, run on this chunk's rank; returns self. `lane`, `channel` (when `other` is on
        a peer) and `sem` override the compiler's choice for this operation."""
        if other.size != self.size:
            raise PlanError(f"reduce of {other!r} into {self!r}: sizes differ ({other.size} != {self.size})")
        op = Op.REDUCE if other.rank == self.rank else Op.READ_REDUCE
        self.prog._record(self.rank, Step(op, (self._ref(), other._ref()), (self._ref(),)), lane, channel, sem,
                          what=f"{self!r}.reduce({other!r})")
        return self

    def _ref(self) -> ChunkRef:
        buf = _BUFFERS.get(self.buffer)
        if buf is None:  # a named scratch buffer: the compiler places it and rewrites the index
            return ChunkRef(self.rank, Buffer.SCRATCH, self.prog._scratch_slot(self.rank, self.buffer, self.index,
                                                                                 self.size), self.size)
        return ChunkRef(self.rank, Buffer(buf), self.index, self.size)

    def __repr__(self) -> str:
        span = f"{self.index}" if self.size == 1 else f"{self.index}:{self.index + self.size}"
        return f"r{self.rank}.{self.buffer}[{span}]"


def chunk(rank: int, buffer: str, index: int, size: int = 1) -> Chunk:
    """`size` chunks of `buffer` on `rank` from `index`, in the program being written (`with program(...)`)."""
    if not _current:
        raise PlanError("chunk() is called outside a `with jaxcoll.lang.program(...)` block")
    return _current[-1]._chunk(rank, buffer, index, size)


class Program:
    """A collective algorithm being written. Use as a context manager, then call `plan()`.

    - `collective`, `nranks`: what it computes and for how many ranks;
    - `chunks`: chunks per block (the granularity the program is written in, k of plan-ir.md);
    - `instances`: replicate the program over that many finer chunks, each replica on its own lanes;
    - `pipeline`: split every chunk into that many pieces moved one after another, so that consecutive hops of
      a chunk overlap;
    - `in_place`, `in_blocks`, `out_blocks`, `root`, `perm`: as in `jaxcoll.plan.Plan`;
    - `postcondition`: for custom collectives, a function (rank, output chunk) -> expected symbolic value or
      None (see `jaxcoll.lang.postcondition`), stated for `reduce_op` ("sum", or "max"/"min" for plans that
      reduce a contribution in more than once); the compiled plan carries it as `Plan.expect`;
    - `max_lanes`: cap on automatically assigned lanes per rank; `fuse`: run instruction fusion.
    """

    def __init__(self, name: str, collective, nranks: int, *, chunks: int = 1, instances: int = 1,
                 pipeline: int = 1, in_place: bool = False, in_blocks: int = 0, out_blocks: int = 0,
                 root: int = 0, perm=(), postcondition: Callable | None = None, reduce_op: str = "sum",
                 max_lanes: int | None = None, fuse: bool = True):
        self.name = name
        self.collective = Collective(collective)
        self.nranks = nranks
        self.chunks = chunks
        self.instances = instances
        self.pipeline = pipeline
        self.in_place = in_place
        din, dout = default_blocks(self.collective, nranks)
        states = definition(self.collective).plan_states
        if states and not (in_blocks and out_blocks):
            raise PlanError("a custom program must state in_blocks and out_blocks")
        if postcondition is not None and not states:
            raise PlanError(f"postcondition= is for custom programs; a {self.collective.value} program's follows "
                            f"from its collective")
        self.in_blocks = in_blocks or din
        self.out_blocks = out_blocks or dout
        self.root = root
        self.perm = tuple(perm)
        self.postcondition = postcondition
        self.reduce_op = reduce_op
        self.max_lanes = max_lanes
        self.fuse = fuse
        self.instrs: list[Instr] = []
        self._scratch_names: dict[str, int] = {}  # name -> buffer number, in order of first use
        self._scratch_sizes: dict[str, int] = {}
        self._plan: Plan | None = None

    def __enter__(self) -> "Program":
        _current.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _current.remove(self)

    # -- recording ------------------------------------------------------------------------------------------
    def _chunk(self, rank: int, buffer: str, index: int, size: int) -> Chunk:
        if not 0 <= rank < self.nranks:
            raise PlanError(f"chunk rank {rank} is out of range for nranks={self.nranks}")
        if size < 1 or index < 0:
            raise PlanError(f"chunk({rank}, {buffer!r}, {index}, size={size}): index must be >= 0, size >= 1")
        buf = _BUFFERS.get(buffer)
        if buf == "input" and index + size > self.in_blocks * self.chunks:
            raise PlanError(f"chunk({rank}, {buffer!r}, {index}, size={size}) is out of range: the input holds "
                            f"{self.in_blocks * self.chunks} chunks")
        if buf == "output" and index + size > self.out_blocks * self.chunks:
            raise PlanError(f"chunk({rank}, {buffer!r}, {index}, size={size}) is out of range: the output holds "
                            f"{self.out_blocks * self.chunks} chunks")
        if buf is None:
            self._scratch_sizes[buffer] = max(self._scratch_sizes.get(buffer, 0), index + size)
        return Chunk(self, rank, buffer, index, size)

    def _scratch_slot(self, rank: int, name: str, index: int, size: int) -> int:
        # laid out when compiling, once every buffer's size is known (`jaxcoll.lang.named_scratch`)
        return named_scratch.placeholder(self._scratch_names.setdefault(name, len(self._scratch_names)), index)

    @property
    def named_scratch_sizes(self) -> list[int]:
        """The chunks each named scratch buffer takes, by buffer number (`jaxcoll.lang.named_scratch`)."""
        return [self._scratch_sizes[name] for name in sorted(self._scratch_names, key=self._scratch_names.get)]

    def _record(self, rank: int, step: Step, lane: int | None, channel: int | None = None,
                sem: int | None = None, *, what: str = "") -> None:
        if self._plan is not None:
            raise PlanError(f"program {self.name!r} is already compiled; record operations before plan()")
        for name, v in (("lane", lane), ("channel", channel), ("sem", sem)):
            if v is not None and (not isinstance(v, int) or v < 0):
                raise PlanError(f"{what}: {name}={v!r}, expected an integer >= 0 (or None to let the compiler "
                                f"choose)")
        if channel is not None and all(ref.rank == rank for ref in step.srcs + step.dsts):
            raise PlanError(f"{what}: channel={channel} on a local operation of rank {rank}; a channel is a "
                            f"connection between two ranks")
        self.instrs.append(Instr(rank, step, lane, channel=channel, sem=sem))

    # -- compiling -----------------------------------------------------------------------------------------
    def plan(self, *, check: bool = True) -> Plan:
        """Compile the recorded operations into a Plan and (by default) prove it with `jaxcoll.lang.check`."""
        if self._plan is None:
            self._plan = compile_program(self, check=check)
        return self._plan



# The spelling programs are written with, `with program(...)`, like `open`: a context manager read as a verb.
program = Program
