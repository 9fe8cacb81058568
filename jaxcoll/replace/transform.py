"""`replace_collectives`: run an existing JAX program's jax.lax collectives on jaxcoll, without editing it.

    step = jax.jit(jaxcoll.replace_collectives(step))       # or @jaxcoll.replace_collectives under @jax.jit
    with jaxcoll.replacing_collectives(): step(x)           # or every program lowered in a block

The transform traces the function to a jaxpr (jax.make_jaxpr) each time it is called, and evaluates that under
whatever is tracing it, replacing the collectives (interpreter.py). Under jax.jit that happens once per
compilation; called eagerly it happens on every call (a transformed jax.jit function keeps its compiled
executable between calls). The block replaces the lowering rules of jax.lax's collectives while it is active
(lowering.py).
"""

from __future__ import annotations

import contextlib
import functools

from jaxcoll.replace import lowering, options as options_
from jaxcoll.replace.interpreter import Session, transform_callable
from jaxcoll.replace.report import Report

UNSET = options_.UNSET


def replace_collectives(f=None, *, collectives=UNSET, algorithm=UNSET, strict=UNSET, report=UNSET):
    """`f` with every jax.lax collective it runs executed by jaxcoll.

    Usable as `replace_collectives(f)`, `@replace_collectives` or `@replace_collectives(algorithm=...)`, over
    or under `jax.jit`, outside or inside `jax.shard_map`. Collectives are reached inside scan, while_loop,
    cond/switch, checkpoint, custom_jvp/custom_vjp (their rules too), nested jit and nested shard_map; the
    gradient of the transformed function runs its transposed collectives on jaxcoll as well.

    Args:
      f: the function (any pytrees of arrays in and out; other arguments pass through unchanged).
      collectives: "all" (default) or the jax.lax names to replace, from "psum" (which covers pmean and the
        psums of a backward pass), "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "ppermute",
        "pbroadcast", "ragged_all_to_all". The others stay XLA's.
      algorithm: None ("auto" everywhere), an algorithm name (used by every collective that has an algorithm
        of that name; "auto" for the others), or a dict from collective name to an algorithm name or a
        `jaxcoll.plan.Plan`.
      strict: a collective jaxcoll cannot run (a dtype the runtime lacks, a Plan that does
        not fit the call) raises ReplacementError naming the collective, the argument and the value, instead
        of running on XLA with a ReplacementWarning.
      report: print the report (a table of what was replaced and what was left to XLA, and why) each time the
        function is traced. The latest report is the attribute `.report` of the returned function either way.

    Options not given take the values of an enclosing `replacing_collectives` block at the time of tracing.

    Returns:
      A function with f's signature and results (equal to f's: bitwise where jaxcoll reduces in the same order
      as XLA, within floating-point rounding of a different summation order otherwise).
    """
    given = dict(collectives=collectives, algorithm=algorithm, strict=strict, report=report)
    options_.make(**given)  # check the arguments where they are written

    def decorate(fn):
        if not callable(fn):
            raise TypeError(f"replace_collectives: f={fn!r} is not callable")

        @functools.wraps(fn)
        def transformed(*args, **kwargs):
            session = Session(options_.make(**given))
            transformed.report = session.report
            out = transform_callable(session, lambda a, k: fn(*a, **k), "")(args, kwargs)
            if session.options.report:
                print(session.report)
            return out

        transformed.report = Report()
        return transformed

    return decorate if f is None else decorate(f)


def replacing_collectives(*, collectives=UNSET, algorithm=UNSET, strict=UNSET, report=UNSET):
    """A block within which every jax.lax collective that JAX lowers runs on jaxcoll, in any program:

        with jaxcoll.replacing_collectives(algorithm="ring") as report:
            loss = jax.jit(step)(params, batch)        # step's psums, and its gradient's, on jaxcoll
        print(report)

    The options mean what they mean for `replace_collectives`, and `replace_collectives` functions traced in the
    block take them as defaults. The block replaces the lowering rules of jax.lax's collective primitives while
    it is active (replace/lowering.py): whatever is lowered there, the transposed collectives of a gradient
    included, lowers jaxcoll's collective instead, or jax's own for what jaxcoll cannot run (a
    ReplacementWarning; ReplacementError when strict). What is lowered inside is decided by the block, options
    given to a `replace_collectives` function inside it notwithstanding, for the collectives it left in place.

    It yields the Report of the calls lowered in it (printed on exit when report=True). It clears JAX's caches on
    entry and on exit (`jax.clear_caches()`), so jit functions recompile inside it and again after it: a
    function compiled in the block runs jaxcoll's collectives, one compiled outside XLA's. Blocks nest (the
    innermost decides); they are not thread-safe, since lowering rules are process-wide.
    """
    given = {k: v for k, v in dict(collectives=collectives, algorithm=algorithm, strict=strict,
                                   report=report).items() if v is not UNSET}
    options_.make(**given)  # fail where the block is written, naming the bad argument
    return _block(given)


@contextlib.contextmanager
def _block(given: dict):
    with options_.defaults(**given):
        block = lowering.Block(options_.make(), Report(source="jaxcoll.replacing_collectives"))
        with block as report:
            yield report
