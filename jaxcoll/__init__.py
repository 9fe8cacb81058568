"""jaxcoll: topology-aware, synthesized collectives for JAX, run by jaxcoll's own runtime through XLA FFI."""

import os as _os

# lowering/ lives beside this package in a source checkout and is installed inside it as jaxcoll.lowering
# (pyproject.toml maps it); extending __path__ lets a checkout run without installing.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isdir(_os.path.join(_checkout, "lowering")) and not _os.path.isdir(
        _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "lowering")):
    __path__.append(_checkout)  # noqa: F821 - __path__ is defined for packages

__version__ = "0.1.0"

from jaxcoll.collectives import all_gather, all_reduce, all_to_all, broadcast, ppermute, reduce_scatter  # noqa: E402

__all__ = ["all_gather", "all_reduce", "all_to_all", "broadcast", "ppermute", "reduce_scatter"]
