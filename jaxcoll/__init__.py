"""jaxcoll: topology-aware, synthesized collectives for JAX, run by jaxcoll's own runtime through XLA FFI."""

from jaxcoll import _jax

_jax.check_version()  # before anything touches JAX, so an unsupported JAX fails here and says why

__version__ = "0.1.0"

from jaxcoll.collectives import all_gather, all_reduce, all_to_all, broadcast, ppermute, reduce_scatter  # noqa: E402
from jaxcoll.compress import adasum  # noqa: E402
from jaxcoll.observe import stats, trace  # noqa: E402
from jaxcoll.replace import replace_collectives, replacing_collectives  # noqa: E402

__all__ = ["adasum", "all_gather", "all_reduce", "all_to_all", "broadcast", "ppermute", "reduce_scatter",
           "replace_collectives", "replacing_collectives", "stats", "trace"]
