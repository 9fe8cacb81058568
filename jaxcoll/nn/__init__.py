"""jaxcoll.nn: layers for `jax.jit` programs with shardings (no shard_map) that run on jaxcoll's fused ops
through custom_partitioning."""

from jaxcoll.nn.dense import dense

__all__ = ["dense"]
