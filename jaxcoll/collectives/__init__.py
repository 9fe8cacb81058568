"""The public collectives: thin functions with the contracts of their jax.lax counterparts, used inside
jax.shard_map. Each states the contract and dispatches: to jaxcoll.compress when asked for compression, else to
the exact collectives (jaxcoll.exact, which check the arguments and bind the primitives)."""

from jaxcoll.collectives.all_gather import all_gather
from jaxcoll.collectives.all_reduce import all_reduce
from jaxcoll.collectives.all_to_all import all_to_all
from jaxcoll.collectives.broadcast import broadcast
from jaxcoll.collectives.ppermute import ppermute
from jaxcoll.collectives.reduce_scatter import reduce_scatter

__all__ = ["all_gather", "all_reduce", "all_to_all", "broadcast", "ppermute", "reduce_scatter"]
