"""jaxcoll.fused: matrix products and epilogues fused with the collectives next to them, overlapped by chunked
decomposition. Each op equals its unfused jax.lax composition (values and gradients) and runs on jaxcoll's
collectives. Use inside `jax.shard_map`; `jaxcoll.nn` reaches them from `jax.jit` with shardings.
See docs/fused.md.
"""

from jaxcoll.fused.adam import AdamState, adam_init, adam_init_global, reduce_scatter_adam_all_gather, shard_size
from jaxcoll.fused.collective_matmul import all_gather_matmul, matmul_reduce_scatter
from jaxcoll.fused.matmul_all_reduce import matmul_all_reduce
from jaxcoll.fused.norm import reduce_scatter_norm_all_gather

__all__ = ["AdamState", "adam_init", "adam_init_global", "all_gather_matmul", "matmul_all_reduce",
           "matmul_reduce_scatter", "reduce_scatter_adam_all_gather", "reduce_scatter_norm_all_gather",
           "shard_size"]
