"""How many pieces a fused op splits its product into, and the checks on that number.

`chunks=1` is the unfused baseline: the whole collective, then the whole product (or the reverse), on jaxcoll's
collectives. For the collective matmuls a multiple of the group size p runs the ring: p steps, each moving one
rank's block while the product of the block that arrived before it computes, with `chunks // p` independent
pieces per block (finer pipelining). `chunks=None` picks by platform and size (`overlap_pays`).
"""

from __future__ import annotations

import jax

# Below this many bytes per rank block a ring step is dominated by its fixed cost, so splitting only adds
# steps. On an H100 a step costs a kernel launch and a signal (a few us) plus the NVLink latency (0.6 us,
# jaxcoll.topology from NCCL's table); 1 MiB at the 450 GB/s of an H100's NVLinks is 2.3 us of transfer, the
# point where a step's transfer is as long as its fixed cost. A model estimate, not yet measured on a GPU.
OVERLAP_MIN_BLOCK_BYTES = 1024 * 1024

# Platforms where a collective and a product can make progress at the same time. On CPU devices they compete:
# the runtime's copies and reductions and the GEMMs run on the same cores (here 8 device threads share 2), so
# splitting hides nothing, while a ring of p steps pays p rendezvous (each collective holds its device thread
# until every rank arrives) instead of one. benchmarks/fused.py measured the forced ring at 0.43-0.87x of
# chunks=1 on this machine (docs/benchmarks-fused.md), so on CPU the choice is 1; `chunks=p` still forces it.
OVERLAP_PLATFORMS = ("gpu", "cuda", "rocm")


def platform() -> str:
    return jax.default_backend()


def overlap_pays(p: int, block_bytes: int) -> bool:
    """Whether splitting the product into pieces that overlap with the collective is expected to be faster
    than chunks=1, for a group of `p` and `block_bytes` per rank block, on the default platform."""
    return p > 1 and platform() in OVERLAP_PLATFORMS and block_bytes >= OVERLAP_MIN_BLOCK_BYTES


def _check_positive(api_name: str, chunks, p: int) -> None:
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
        raise ValueError(f"{api_name}: chunks={chunks!r} must be None (chosen by size), 1 (no overlap) or a "
                         f"positive multiple of the group size {p}")


def choose(api_name: str, chunks, p: int, block_bytes: int, block_dim: int, dim_name: str) -> int:
    """The chunk count a ring op (all_gather_matmul, matmul_reduce_scatter) runs with: `chunks` checked, or
    chosen when None.

    `block_dim` is the extent of one rank's block along the dimension the pieces split; it must divide into
    `chunks // p` pieces.
    """
    if chunks is None:
        return p if overlap_pays(p, block_bytes) else 1
    _check_positive(api_name, chunks, p)
    if chunks == 1:
        return 1
    if chunks % p:
        raise ValueError(f"{api_name}: chunks={chunks} must be 1 (no overlap) or a multiple of the group size "
                         f"p={p} (the ring moves one rank's block per step)")
    pieces = chunks // p
    if block_dim % pieces:
        raise ValueError(f"{api_name}: chunks={chunks} splits each rank's block into {pieces} pieces along "
                         f"{dim_name}, but that block has extent {block_dim}, not divisible by {pieces}")
    return chunks


def choose_pieces(api_name: str, chunks, p: int, piece_bytes: int, extent: int, dim_name: str) -> int:
    """The number of pieces an op that pipelines whole collectives (matmul_all_reduce) splits `extent` into:
    `chunks` checked (any positive divisor of `extent`), or chosen when None (p pieces where overlap pays and
    p divides `extent`, else 1). `piece_bytes` is the size of one of p pieces."""
    if chunks is None:
        return p if extent % p == 0 and overlap_pays(p, piece_bytes) else 1
    _check_positive(api_name, chunks, p)
    if extent % chunks:
        raise ValueError(f"{api_name}: chunks={chunks} splits {dim_name} into equal pieces, but its extent "
                         f"{extent} is not divisible by {chunks}")
    return chunks
