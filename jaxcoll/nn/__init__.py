"""jaxcoll.nn: layers for `jax.jit` programs with shardings (no shard_map) that run on jaxcoll's fused ops
through custom_partitioning."""

from jaxcoll.nn.adam import adamw, adamw_init
from jaxcoll.nn.cross_entropy import cross_entropy
from jaxcoll.nn.dense import dense
from jaxcoll.nn.embed import embed
from jaxcoll.nn.norm import dense_norm, norm

__all__ = ["adamw", "adamw_init", "cross_entropy", "dense", "dense_norm", "embed", "norm"]
