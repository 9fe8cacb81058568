"""Existing JAX programs on jaxcoll without editing them: `replace_collectives(f)` runs every jax.lax collective
of f (psum, pmean, pmax, pmin, all_gather, psum_scatter, all_to_all, ragged_all_to_all, ppermute, pbroadcast; with
axis_index_groups, and jax's reduced/unreduced forms), wherever it is in the traced program and in its gradient,
as jaxcoll's collectives. docs/replace.md describes it.

`with replacing_collectives():` does the same to every program JAX lowers inside the block.

transform.py: the public function and context; interpreter.py: the evaluation of the traced program;
lowering.py: the context's lowering rules; collectives.py: which jax.lax primitive becomes which jaxcoll call,
for both; options.py, report.py: what they say.
"""

from jaxcoll.replace.collectives import ReplacementError, ReplacementWarning
from jaxcoll.replace.report import Entry, Report
from jaxcoll.replace.transform import replace_collectives, replacing_collectives

__all__ = ["Entry", "ReplacementError", "ReplacementWarning", "Report", "replace_collectives",
           "replacing_collectives"]
