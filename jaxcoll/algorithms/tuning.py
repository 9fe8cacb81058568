"""Which built-in algorithm "auto" picks, NCCL-tuning style: a small table of measured crossovers, one rule per
collective. The constants were measured with `python -m jaxcoll bench --algorithms` on the CPU runtime (8 device
threads, 2 cores; docs/benchmarks.md); both candidates are correct at every size, only speed differs.
"""

from __future__ import annotations

from jaxcoll.plan import Collective

# all_reduce: one-shot reads N*S bytes per rank but needs no chunking; two-shot moves the minimum 2*N*S bytes in
# all. Below this many bytes per rank the one-shot's single unsplit pass wins.
ALL_REDUCE_DIRECT_MAX_BYTES = 16 * 1024


def auto(collective: Collective, nranks: int, nbytes: int, processes: tuple[int, ...] = ()) -> str:
    """The algorithm name "auto" means for a call of `nbytes` bytes per rank input over `nranks` ranks;
    `processes[r]` is the process of rank r when the group spans processes (empty otherwise)."""
    if len(set(processes)) > 1:
        # Across processes a direct plan that writes another process's output, or reads its input, makes the
        # runtime copy those chunks through shared memory; the hierarchical plans keep the crossing on scratch
        # (docs/multiprocess.md, where the benchmark's numbers are).
        from jaxcoll.algorithms import hierarchical
        if collective in (Collective.ALL_GATHER, Collective.ALL_TO_ALL):
            return "hierarchical"
        if collective in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER) and hierarchical.uniform(processes):
            return "hierarchical"
    if collective is Collective.ALL_REDUCE:
        return "direct" if nranks <= 2 or nbytes <= ALL_REDUCE_DIRECT_MAX_BYTES else "two_shot"
    return "direct"
