"""What each collective means, one entry a collective: the one place a reader looks up a collective, and the one
place a new collective is added (docs/plan-ir.md, "Adding a collective").

An entry gives the collective's wire code, its block counts as functions of the group size N (how many equal,
independent blocks of the per-rank message its input and output hold; chunks subdivide blocks), the call
parameters that complete its meaning (`root`, `perm`), how an in-place plan aliases its buffers, whether it
applies the call's reduction, its postcondition, and its names in the formats of the field (MSCCL XML's `coll`,
the MSCCL++ JSON execution plan's `collective`).

csrc/collectives.hpp spells the part the runtimes read (code, name, blocks, aliasing, whether it reduces and
whether the plan states its meaning); the native module reports its copy (`jaxcoll._jaxcoll.abi()`) and
tests/test_collectives_table.py holds the two together. The postcondition, the parameters and the file-format
names are Python's alone: the executors run steps and need none of them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

from jaxcoll.plan.errors import PlanError


class Collective(str, enum.Enum):
    """What a plan computes. The string value is what goes into plan files."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    PPERMUTE = "ppermute"
    CUSTOM = "custom"


class InPlace(str, enum.Enum):
    """How an in-place plan (`Plan.in_place`, MSCCL's meaning) lays its input and output in one memory."""

    SAME = "same"  # input and output are the same buffer
    INPUT_IN_OUTPUT = "input_in_output"  # rank r's input is block r of its output (all_gather)
    OUTPUT_IN_INPUT = "output_in_input"  # rank r's output is block r of its input (reduce_scatter)


ZERO = ("zero",)  # a contribution term: the chunk holds zeros (a zero step wrote it)

# A postcondition, given (N, chunks per block k, root, perm), is a function (rank, output chunk index) -> the
# contributions the chunk must hold at exit: (rank, input chunk index) terms or ZERO, reduced with the call's op;
# or None for a chunk that is not part of the result.
Contributions = Callable[[int, int], tuple]
PostconditionRule = Callable[[int, int, int, tuple], Contributions]


@dataclasses.dataclass(frozen=True)
class Definition:
    """One collective's entry in the table (see the module docstring)."""

    collective: Collective
    code: int  # its code in the serialized plan and the network target's `collective` attribute: never renumber
    in_blocks: Callable[[int], int]  # N -> input blocks of a rank
    out_blocks: Callable[[int], int]  # N -> output blocks of a rank
    in_place: InPlace
    reduces: bool  # applies the call's reduction (reduce_op) to its inputs (custom: its steps may)
    msccl: str  # MSCCL XML <algo coll=...>
    mscclpp: str  # MSCCL++ execution plan "collective"
    params: tuple[str, ...] = ()  # the Plan fields beyond its kind that its meaning needs: "root", "perm"
    # None: the plan states its own meaning (Plan.expect) and its own block counts; in_blocks and out_blocks are
    # then only what a plan that states none gets.
    postcondition: PostconditionRule | None = None

    @property
    def plan_states(self) -> bool:
        """Whether each plan states what it computes (a custom plan), rather than the collective."""
        return self.postcondition is None

    def blocks(self, nranks: int) -> tuple[int, int]:
        """(input blocks, output blocks) of a rank in a group of `nranks`."""
        return self.in_blocks(nranks), self.out_blocks(nranks)


def _one_block(n: int) -> int:
    return 1


def _block_per_rank(n: int) -> int:
    return n


def _all_reduce(n, k, root, perm) -> Contributions:
    return lambda r, i: tuple((s, i) for s in range(n))


def _all_gather(n, k, root, perm) -> Contributions:
    return lambda r, i: ((i // k, i % k),)


def _reduce_scatter(n, k, root, perm) -> Contributions:
    return lambda r, i: tuple((s, r * k + i) for s in range(n))


def _all_to_all(n, k, root, perm) -> Contributions:
    return lambda r, i: ((i // k, r * k + i % k),)


def _broadcast(n, k, root, perm) -> Contributions:
    if not 0 <= root < n:
        raise PlanError(f"broadcast root={root} is out of range for nranks={n}")
    return lambda r, i: ((root, i),)


def _ppermute(n, k, root, perm) -> Contributions:
    source = {}
    for a, b in perm:
        if not (0 <= a < n and 0 <= b < n):
            raise PlanError(f"ppermute pair ({a}, {b}) is out of range for nranks={n}")
        if b in source:
            raise PlanError(f"ppermute perm sends to rank {b} twice: from {source[b]} and from {a}")
        source[b] = a
    if len({a for a, _ in perm}) != len(perm):
        raise PlanError(f"ppermute perm={list(perm)} sends from one rank twice")
    return lambda r, i: ((source[r], i),) if r in source else (ZERO,)  # lax.ppermute: zeros where none is sent


C, ONE, PER_RANK = Collective, _one_block, _block_per_rank
TABLE: dict[Collective, Definition] = {d.collective: d for d in (
    Definition(C.ALL_REDUCE, code=0, in_blocks=ONE, out_blocks=ONE, in_place=InPlace.SAME, reduces=True,
               msccl="allreduce", mscclpp="allreduce", postcondition=_all_reduce),
    Definition(C.ALL_GATHER, code=1, in_blocks=ONE, out_blocks=PER_RANK, in_place=InPlace.INPUT_IN_OUTPUT,
               reduces=False, msccl="allgather", mscclpp="allgather", postcondition=_all_gather),
    Definition(C.REDUCE_SCATTER, code=2, in_blocks=PER_RANK, out_blocks=ONE, in_place=InPlace.OUTPUT_IN_INPUT,
               reduces=True, msccl="reducescatter", mscclpp="reducescatter", postcondition=_reduce_scatter),
    Definition(C.ALL_TO_ALL, code=3, in_blocks=PER_RANK, out_blocks=PER_RANK, in_place=InPlace.SAME,
               reduces=False, msccl="alltoall", mscclpp="alltoall", postcondition=_all_to_all),
    Definition(C.BROADCAST, code=4, in_blocks=ONE, out_blocks=ONE, in_place=InPlace.SAME, reduces=False,
               msccl="broadcast", mscclpp="broadcast", params=("root",), postcondition=_broadcast),
    Definition(C.PPERMUTE, code=5, in_blocks=ONE, out_blocks=ONE, in_place=InPlace.SAME, reduces=False,
               msccl="ppermute", mscclpp="sendrecv", params=("perm",), postcondition=_ppermute),
    Definition(C.CUSTOM, code=6, in_blocks=ONE, out_blocks=ONE, in_place=InPlace.SAME, reduces=True,
               msccl="custom", mscclpp="custom"),
)}
del C, ONE, PER_RANK

_BY_CODE = {d.code: d for d in TABLE.values()}


def definition(collective: Collective | str) -> Definition:
    """The table entry of `collective` (a member or its name); PlanError naming it when it has none."""
    try:
        return TABLE[Collective(collective)]
    except (KeyError, ValueError):
        raise PlanError(f"unknown collective {collective!r}; known: "
                        f"{', '.join(c.value for c in TABLE)}") from None


def from_code(code: int) -> Collective:
    """The collective of a wire code; PlanError naming the code when none has it."""
    if code not in _BY_CODE:
        raise PlanError(f"unknown collective code {code}; known: "
                        f"{', '.join(f'{d.code} ({d.collective.value})' for d in _BY_CODE.values())}")
    return _BY_CODE[code].collective


# Wire codes by collective (jaxcoll.plan.wire, the network target's attribute).
COLLECTIVE_CODES = {c: d.code for c, d in TABLE.items()}
