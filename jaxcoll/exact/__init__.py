"""The exact collectives: each checks its arguments while tracing (arguments.py) and binds its primitive from
jaxcoll.lowering. The layer below both the public collectives (jaxcoll.collectives, which dispatch here unless
asked for compression) and the compressed ones (jaxcoll.compress, whose hops run on these), so neither calls
the other's module to reach an exact collective, and no caller binds a primitive past the checks.

Same arguments and results as the public functions, without `compression=`; all_gather also takes lax's
invariant form (`invariant=True`: lax.all_gather(..., to="invarying")). ragged_all_to_all has no public function of
its own: it is lax.ragged_all_to_all's contract run on all_to_all, for `jaxcoll.replace_collectives`."""

from jaxcoll.exact.all_gather import all_gather
from jaxcoll.exact.all_reduce import all_reduce
from jaxcoll.exact.all_to_all import all_to_all
from jaxcoll.exact.broadcast import broadcast
from jaxcoll.exact.ppermute import ppermute
from jaxcoll.exact.ragged_all_to_all import ragged_all_to_all
from jaxcoll.exact.reduce_scatter import reduce_scatter

__all__ = ["all_gather", "all_reduce", "all_to_all", "broadcast", "ppermute", "ragged_all_to_all",
           "reduce_scatter"]
