"""The context form of the transform: within `with jaxcoll.replacing_collectives():`, every jax.lax collective
that JAX lowers runs on jaxcoll, in any program, transformed or not.

Where the transform (interpreter.py) rewrites one function's traced program, the block swaps the lowering
rules of jax.lax's collective primitives, through jax's `register_lowering` (jaxcoll/_jax.py): while it
is active, lowering a psum (psum_invariant, pmax, ..., and whatever autodiff put in a backward pass, since
lowering sees the final program) lowers jaxcoll's counterpart instead, with `lower_fun` of the function
that `collectives.replacement` gives, the same decision the transform makes. A call it leaves to XLA lowers
with jax's own rule, saved on entry. On exit jax's rules come back exactly as they were.

Lowering rules are process-wide: a block is not thread-safe (another thread lowering while it is active gets
jaxcoll too). Blocks nest: the innermost active one decides. JAX caches what it traced, lowered and compiled,
so the block clears its caches (`jax.clear_caches()`) on entry and on exit: a jit function compiled outside
recompiles inside (to jaxcoll's collectives) and again after (to XLA's). That costs one compilation per
function per crossing, and it drops the compiled programs of every other function too.
"""

from __future__ import annotations

import os
import threading

import jax
from jax import lax
from jax.extend import source_info_util

from jaxcoll import _jax
from jaxcoll.replace import collectives
from jaxcoll.replace.options import Options
from jaxcoll.replace.report import Report


def primitives() -> dict:
    """The jax.lax collective primitives whose lowering the block replaces, by jaxpr name: those of
    collectives.RULES but pvary (a cast that lowers to nothing), and those of collectives.UNSUPPORTED (lowered by
    jax's rule, with the report row and the warning of a fallback). A name the running JAX lacks is skipped."""
    public = (lax.psum_p, lax.pmax_p, lax.pmin_p, lax.all_gather_p, lax.all_to_all_p, lax.ppermute_p,
              lax.ragged_all_to_all_p)
    found = {**_jax.lax_collective_primitives(), **{p.name: p for p in public}}
    names = [n for n in (*collectives.RULES, *collectives.UNSUPPORTED) if n != "pvary"]
    return {n: found[n] for n in names if n in found}


class Block:
    """One `replacing_collectives` block: its options, and the report of the collectives lowered in it."""

    def __init__(self, options: Options, report: Report):
        self.options, self.report = options, report

    def __enter__(self) -> Report:
        with _lock:
            if not _active:
                _jax_rules.update({p: _jax.LoweringRules(p) for p in primitives().values()})
            _active.append(self)
            _apply()
        jax.clear_caches()
        return self.report

    def __exit__(self, *exc) -> bool:
        with _lock:
            _active.remove(self)  # blocks that end out of order (threads) still leave the innermost one's rules
            _apply()
            if not _active:
                _jax_rules.clear()
        jax.clear_caches()
        if self.options.report:
            print(self.report)
        return False


_lock = threading.Lock()
_active: list[Block] = []  # the blocks entered and not yet ended, outermost first
_jax_rules: dict = {}  # primitive -> _jax.LoweringRules: JAX's own, saved when the first block began


def _apply() -> None:
    """JAX's rules, then the innermost active block's over them."""
    for saved in _jax_rules.values():
        saved.restore()
    if not _active:
        return
    block = _active[-1]
    for name, primitive in primitives().items():
        saved = _jax_rules[primitive]
        # cacheable=False: jax would otherwise lower equal calls once and share the function between call
        # sites, which would then share jaxcoll's rendezvous key (lowering/custom_call.py).
        _jax.register_lowering(primitive, _rule(block, name, saved.default), cacheable=False)
        # A rule of jax's own for one platform wins over the default rule: replace those too.
        for platform, rule in saved.platforms.items():
            _jax.register_lowering(primitive, _rule(block, name, rule), platform=platform, cacheable=False)


def _rule(block: Block, name: str, original):
    """The lowering rule of primitive `name` in `block`: jaxcoll's collective, or `original` (jax's rule, None
    where jax has none) for a call the block leaves to XLA."""

    def rule(ctx, *args, **params):
        platforms = tuple(ctx.platforms or ctx.module_context.platforms)
        run = collectives.replacement(block.options, name, params, ctx.avals_in, _where(ctx), block.report.add,
                                      platforms=platforms, api="replacing_collectives")
        if run is not None:
            return _jax.lower_fun(run, multiple_results=True)(ctx, *args)
        if original is None:
            raise NotImplementedError(f"jax.lax has no lowering of {name} for platforms {platforms}, and "
                                      f"replacing_collectives left it to XLA")
        return original(ctx, *args, **params)

    return rule


def _where(ctx) -> str:
    """Where the lowered call was written: the user's file, line and function (and the name stack jax keeps,
    where it keeps one); a file under the working directory relative to it, as pytest and tracebacks' readers
    expect, so the report's column shows the name rather than a long absolute prefix."""
    where = source_info_util.summarize(source_info_util.SourceInfo(ctx.traceback, ctx.name_stack))
    cwd = os.getcwd() + os.sep
    return where[len(cwd):] if where.startswith(cwd) else where
