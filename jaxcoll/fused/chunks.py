"""How many pieces a fused op splits its product into, and the checks on that number.

`chunks=1` is the unfused baseline: the whole collective, then the whole product (or the reverse). A multiple
of the group size p runs the ring: p steps, each moving one rank's block while the product of the block that
arrived before it computes, with `chunks // p` independent pieces per block (finer pipelining).
`chunks=None` picks by size: the ring when a rank's block is large enough that moving it costs more than the
extra per-step launch, else 1.
"""

from __future__ import annotations

# Below this many bytes per rank block a ring step is dominated by its fixed cost (a rendezvous on CPU, a
# kernel launch on GPU), so splitting only adds steps. 64 KiB is where jaxcoll's CPU all-gather stops being
# latency-bound in `jaxcoll bench` on the development machine; revisit per platform.
OVERLAP_MIN_BLOCK_BYTES = 64 * 1024


def choose(api_name: str, chunks, p: int, block_bytes: int, block_dim: int, dim_name: str) -> int:
    """The chunk count a call runs with: `chunks` checked, or chosen when None.

    `block_dim` is the extent of one rank's block along the dimension the pieces split; it must divide into
    `chunks // p` pieces.
    """
    if chunks is None:
        return p if p > 1 and block_bytes >= OVERLAP_MIN_BLOCK_BYTES else 1
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
        raise ValueError(f"{api_name}: chunks={chunks!r} must be None (chosen by size), 1 (no overlap) or a "
                         f"positive multiple of the group size {p}")
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
