"""Existing JAX programs on jaxcoll without editing them: `replace_collectives(f)` runs every jax.lax collective
of f (psum, pmean, pmax, pmin, all_gather, psum_scatter, all_to_all, ppermute, pbroadcast), wherever it is in
the traced program and in its gradient, as jaxcoll's collectives. docs/replace.md describes it.

transform.py: the public function and context; interpreter.py: the evaluation of the traced program;
collectives.py: which jax.lax primitive becomes which jaxcoll call; options.py, report.py: what they say.
"""

from jaxcoll.replace.collectives import ReplacementError, ReplacementWarning
from jaxcoll.replace.report import Entry, Report
from jaxcoll.replace.transform import replace_collectives, replacing_collectives

__all__ = ["Entry", "ReplacementError", "ReplacementWarning", "Report", "replace_collectives",
           "replacing_collectives"]
