"""Where a plan's chunks lie in memory for a given message size: the Python twin of the executors' rule.

Each buffer is a row of equal *blocks* (the per-rank pieces the collective is defined over: all_gather's output
has one block per rank) and each block is split into k = `Plan.chunk_factor` chunks with a balanced split, so
any element count works: chunk j of a block of m elements spans [floor(j*m/k), floor((j+1)*m/k)). Chunks with
the same index modulo k have the same size in every buffer, which is what makes a copy between them well formed.
The C++ executor (csrc/layout.hpp) computes the same ranges; tests compare the two.
"""

from __future__ import annotations

from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.ir import Buffer, ChunkRef, Plan


def block_elements(plan: Plan, input_elements: int) -> int:
    """Elements of one block, m, for a rank's input of `input_elements` elements."""
    if input_elements % plan.in_blocks:
        raise PlanError(f"input of {input_elements} elements does not split into the plan's "
                        f"in_blocks={plan.in_blocks} blocks")
    return input_elements // plan.in_blocks


def buffer_elements(plan: Plan, rank: int, buffer: Buffer, block: int) -> int:
    k = plan.chunk_factor
    return plan.ranks[rank].chunks(buffer) // k * block


def chunk_range(k: int, block: int, index: int, count: int = 1) -> tuple[int, int]:
    """Element range [start, stop) of chunks index..index+count-1 of a buffer with blocks of `block` elements
    split into `k` chunks each."""
    def start(i: int) -> int:
        b, j = divmod(i, k)
        return b * block + (j * block) // k
    return start(index), start(index + count)


def ref_range(plan: Plan, ref: ChunkRef, block: int) -> tuple[int, int]:
    return chunk_range(plan.chunk_factor, block, ref.index, ref.count)
