"""JAX primitives of jaxcoll's collectives and their rules (abstract eval, lowering to the jaxcoll custom call,
jvp/transpose, batching), one module per collective. The exact collectives (`jaxcoll.exact`, under the public
ones and the compressed ones) validate their arguments (`jaxcoll.exact.arguments`) and bind these; the rules here
take the parameters as checked (the transposes and batching rules bind only shapes and parameters that follow from
checked ones)."""

from jaxcoll.lowering.all_gather import all_gather_p, all_gather_reduced_p
from jaxcoll.lowering.all_reduce import all_reduce_p, unreduced_psum_p
from jaxcoll.lowering.all_to_all import all_to_all_p
from jaxcoll.lowering.broadcast import broadcast_p
from jaxcoll.lowering.ppermute import ppermute_p
from jaxcoll.lowering.pvary import pvary_p
from jaxcoll.lowering.reduce_scatter import reduce_scatter_p, unreduced_reduce_scatter_p

__all__ = ["all_gather_p", "all_gather_reduced_p", "all_reduce_p", "all_to_all_p", "broadcast_p", "ppermute_p",
           "pvary_p", "reduce_scatter_p", "unreduced_psum_p", "unreduced_reduce_scatter_p"]
