"""The jax.lax collectives jaxcoll replaces: for each primitive of a program (by its name in the jaxpr), the
jax.lax collective it is, the axes it runs over, and the jaxcoll call that runs it instead.

`replacement` decides one call, for the transform's interpreter (interpreter.py) and for the lowering rules of
the context form (lowering.py) alike: a function of the operands that binds jaxcoll's collective, or None when
the call stays XLA's (not among the options' collectives; or one jaxcoll cannot run as asked, which `check`
finds, naming the argument and the value: a warning, or ReplacementError when strict). Either way the report
gets its row.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import numpy as np

from jaxcoll import _jax, exact
from jaxcoll.exact.ragged_all_to_all import check_typing as check_ragged_typing
from jaxcoll.exact.arguments import check_algorithm
from jaxcoll.lowering import groups, pvary
from jaxcoll.lowering.dtypes import check_dtype
from jaxcoll.replace.options import COLLECTIVES, Options
from jaxcoll.replace.report import Entry


# The platforms jaxcoll's runtime registers its FFI targets for (runtime.py); elsewhere a collective stays XLA's.
PLATFORMS = ("cpu", "cuda")


class ReplacementError(ValueError):
    """A collective that `replace_collectives(strict=True)` cannot run on jaxcoll."""


class ReplacementWarning(UserWarning):
    """A collective left to XLA by `replace_collectives` (strict=False), with the reason."""


class Unsupported(Exception):
    """This call cannot run on jaxcoll: `argument` has `value`, and `reason` says why."""

    def __init__(self, argument: str, value, reason: str):
        super().__init__(reason)
        self.argument, self.value, self.reason = argument, value, reason


@dataclasses.dataclass(frozen=True)
class Rule:
    """collective: the jax.lax name (the key of `collectives=` and `algorithm=`); jaxcoll: what runs it;
    axes: the equation's axis names from its parameters; run(x, params, algorithm): one operand's result, or,
    where `together`, run(operands, params, algorithm): the list of results of operands that are one call's
    arguments (ragged_all_to_all's operand, output, offsets and sizes) rather than a pytree's leaves."""

    collective: str
    jaxcoll: str
    axes: Callable[[dict], tuple]
    run: Callable
    op: str | None = None  # the reduction, for the dtype check; None: data movement only
    together: bool = False
    unreduced: bool = False  # jax's unreduced form: its operands are unreduced over its axes


def _names(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _reduction(op):
    return lambda x, p, algorithm: exact.all_reduce(x, _names(p["axes"]), op=op, algorithm=algorithm,
                                                    axis_index_groups=p.get("axis_index_groups"))


def _all_gather(to: str):
    def run(x, p, algorithm):
        # to="invarying" and to="reduced": lax.all_gather's typed forms, which only the exact all_gather has (no
        # public jaxcoll function types its result invariant or reduced).
        return exact.all_gather(x, _names(p["axis_name"]), axis=p["all_gather_dimension"], tiled=p["tiled"],
                                algorithm=algorithm, invariant=to == "invarying", reduced=to == "reduced",
                                axis_index_groups=p.get("axis_index_groups"))
    return run


def _psum_scatter(x, p, algorithm):
    return exact.reduce_scatter(x, _names(p["axis_name"]), scatter_dimension=p["scatter_dimension"],
                                tiled=p["tiled"], algorithm=algorithm, axis_index_groups=p.get("axis_index_groups"))


def _all_to_all(x, p, algorithm):
    # The primitive always has the tiled shape contract (lax.all_to_all adds and drops the unit dimensions of
    # its untiled form around it): jaxcoll's tiled form has the same one.
    return exact.all_to_all(x, _names(p["axis_name"]), p["split_axis"], p["concat_axis"], tiled=True,
                            algorithm=algorithm, axis_index_groups=p.get("axis_index_groups"))


def _ragged_all_to_all(operands, p, algorithm):
    return [exact.ragged_all_to_all(*operands, _names(p["axis_name"]), algorithm=algorithm,
                                    axis_index_groups=p.get("axis_index_groups"))]


def _ppermute(x, p, algorithm):
    return exact.ppermute(x, _names(p["axis_name"]), p["perm"], algorithm=algorithm)


def _pbroadcast(x, p, algorithm):
    return exact.broadcast(x, _names(p["axis_name"]), root=p["source"], algorithm=algorithm)


def _pvary(x, p, algorithm):
    # A type cast with no arguments to check beyond its axes (no collective runs; its transpose is an all_reduce):
    # jaxcoll's primitive, as lowering/all_reduce.py's transpose binds it.
    return pvary.bind(x, axes=_names(p["axes"]), algorithm=algorithm)


_AXES = lambda p: _names(p["axes"])  # noqa: E731
_AXIS_NAME = lambda p: _names(p["axis_name"])  # noqa: E731

# jaxpr primitive name -> rule. Names as jax 0.10.2 to 0.12 write them: lax.psum binds psum_invariant under
# shard_map(check_vma=True) and psum otherwise; lax.all_gather(to="invarying") binds all_gather_invariant;
# lax.psum_scatter binds reduce_scatter; pvary is the invariant->varying cast whose transpose is a psum. jax's
# reduced/unreduced collectives: lax.psum and lax.psum_scatter of a value unreduced over their axes bind
# unreduced_psum and unreduced_reduce_scatter, lax.all_gather(to="reduced") all_gather_reduced (the exact
# collectives choose the same forms from the same types).
RULES = {
    "psum": Rule("psum", "jaxcoll.all_reduce", _AXES, _reduction("sum"), op="sum"),
    "psum_invariant": Rule("psum", "jaxcoll.all_reduce", _AXES, _reduction("sum"), op="sum"),
    "pmax": Rule("pmax", "jaxcoll.all_reduce(op='max')", _AXES, _reduction("max"), op="max"),
    "pmin": Rule("pmin", "jaxcoll.all_reduce(op='min')", _AXES, _reduction("min"), op="min"),
    "unreduced_psum": Rule("psum", "jaxcoll.all_reduce", _AXES, _reduction("sum"), op="sum", unreduced=True),
    "all_gather": Rule("all_gather", "jaxcoll.all_gather", _AXIS_NAME, _all_gather("varying")),
    "all_gather_invariant": Rule("all_gather", "jaxcoll.all_gather", _AXIS_NAME, _all_gather("invarying")),
    "all_gather_reduced": Rule("all_gather", "jaxcoll.all_gather", _AXIS_NAME, _all_gather("reduced")),
    "reduce_scatter": Rule("psum_scatter", "jaxcoll.reduce_scatter", _AXIS_NAME, _psum_scatter, op="sum"),
    "unreduced_reduce_scatter": Rule("psum_scatter", "jaxcoll.reduce_scatter", _AXIS_NAME, _psum_scatter,
                                     op="sum", unreduced=True),
    "all_to_all": Rule("all_to_all", "jaxcoll.all_to_all", _AXIS_NAME, _all_to_all),
    "ragged_all_to_all": Rule("ragged_all_to_all", "jaxcoll.ragged_all_to_all", _AXIS_NAME, _ragged_all_to_all,
                              together=True),
    "ppermute": Rule("ppermute", "jaxcoll.ppermute", _AXIS_NAME, _ppermute),
    "pbroadcast": Rule("pbroadcast", "jaxcoll.broadcast", _AXIS_NAME, _pbroadcast),
    "pvary": Rule("psum", "jaxcoll pvary (transpose: jaxcoll.all_reduce)", _AXES, _pvary),
}


# jax.lax collectives jaxcoll has no counterpart for: they run on XLA, with a warning (an error when strict).
UNSUPPORTED = {
    "psend": "jaxcoll has no point-to-point send (psend/precv); ppermute is its exchange",
    "precv": "jaxcoll has no point-to-point receive (psend/precv); ppermute is its exchange",
    "unreduced_pmax": "jaxcoll has no pmax of unreduced-typed values",
    "unreduced_pmin": "jaxcoll has no pmin of unreduced-typed values",
    "pbroadcast_dynamic": "jaxcoll's broadcast has a static root, not one computed at run time",
    **{f"{name}_start": "jaxcoll has no asynchronous (start/done) collectives" for name in (
        "all_gather", "all_gather_reduced", "psum", "psum_invariant", "unreduced_psum", "reduce_scatter",
        "unreduced_reduce_scatter", "all_to_all", "pbroadcast", "ppermute")},
}


def label(primitive: str) -> str:
    """The name a report shows for a primitive: the lax collective, or "pvary" for the cast."""
    return "pvary" if primitive == "pvary" else RULES[primitive].collective


def replacement(options: Options, primitive: str, params: dict, avals, where: str,
                record: Callable[[Entry], None], platforms: tuple = (),
                api: str = "replace_collectives") -> Callable | None:
    """How one call of `primitive` (a key of RULES or UNSUPPORTED) with `params` on operands of types `avals` runs.

    A function from the operands to the list of results, binding jaxcoll's collective; or None when the call
    stays XLA's: its collective is not in `options.collectives`, or jaxcoll cannot run it as asked (then a
    ReplacementWarning names the collective, the argument and the value; ReplacementError instead when
    `options.strict`). `record` gets the report's Entry either way; `where` says where the call is;
    `platforms`, where known (at lowering), those the program is lowered for; `api` the name messages give.
    """
    aval = avals[0] if avals and hasattr(avals[0], "shape") else None  # precv's operand is a token
    entry = dict(primitive=primitive, where=where, shape=tuple(aval.shape) if aval is not None else (),
                 dtype=np.dtype(aval.dtype).name if aval is not None else "")
    if primitive in UNSUPPORTED:
        axes = _names(params.get("axes", params.get("axis_name", ())))
        _fall_back(options, record, api, dict(entry, collective=primitive, axes=axes),
                   f"lax {primitive} over axis_name={axes}", f"primitive={primitive!r}: {UNSUPPORTED[primitive]}")
        return None
    rule = RULES[primitive]
    algorithm = options.algorithm(rule.collective)
    entry.update(collective=label(primitive), axes=rule.axes(params))
    if rule.collective not in options.collectives:
        record(Entry(**entry, replaced=False, reason=f"{rule.collective} is not in collectives="))
        return None
    try:
        check(rule, params, avals, algorithm, platforms)
    except Unsupported as e:
        call = f"lax.{entry['collective']} ({primitive}) over axis_name={entry['axes']}"
        _fall_back(options, record, api, entry, call, f"{e.argument}={e.value!r}: {e.reason}")
        return None
    record(Entry(**entry, replaced=True, jaxcoll=rule.jaxcoll,
                 algorithm=algorithm if isinstance(algorithm, str) else (algorithm.name or "plan")))
    if rule.together:
        return lambda *operands: rule.run(operands, params, algorithm)
    return lambda *operands: [rule.run(x, params, algorithm) for x in operands]


def _fall_back(options: Options, record, api: str, entry: dict, call: str, reason: str) -> None:
    """The warning that `call` runs on XLA, naming it and the reason, and its report row; ReplacementError when
    strict."""
    where = f" in {entry['where']}" if entry["where"] else ""
    if options.strict:
        raise ReplacementError(f"{api}(strict=True): {call}{where} cannot run on jaxcoll: {reason}")
    warnings.warn(f"{api}: {call}{where} left to XLA: {reason}", ReplacementWarning, stacklevel=3)
    record(Entry(**entry, replaced=False, reason=reason))


def check(rule: Rule, params: dict, avals, algorithm, platforms: tuple = ()) -> None:
    """Unsupported unless jaxcoll can run this call, on operands of types `avals` and on `platforms`, as its
    parameters ask."""
    other = [p for p in platforms if p not in PLATFORMS]
    if other:
        raise Unsupported("platform", other[0], f"jaxcoll's runtime runs on {' and '.join(PLATFORMS)} devices")
    axes = rule.axes(params)
    if not axes:
        raise Unsupported("axis_name", axes, "a collective over no axes has no group to run in")
    positional = [a for a in axes if isinstance(a, int)]
    if positional:
        raise Unsupported("axis_name", axes, "positional (integer) axes are not mesh axes")
    from jax.sharding import get_abstract_mesh
    mesh_axes = set(get_abstract_mesh().axis_names)
    if any(a in mesh_axes for a in axes) and not all(a in mesh_axes for a in axes):
        raise Unsupported("axis_name", axes, "it mixes vmap axes with mesh axes, which jaxcoll's batching rules "
                                             "do not split")
    for x in avals if not rule.unreduced else ():
        for kind, over in (("unreduced", _jax.unreduced_axes(x)), ("reduced", _jax.reduced_axes(x))):
            if over & set(axes):
                raise Unsupported("x", f"{kind} over {', '.join(map(str, sorted(over & set(axes), key=str)))}",
                                  f"jaxcoll's {rule.jaxcoll} would not keep jax's type for a value {kind} over "
                                  f"its axes")
    # Bad groups are the program's error, not a reason to fall back: lax leaves those it does not check (groups
    # of unequal size, or not covering the axis) to XLA's compiler; jaxcoll names them while tracing.
    groups.index_groups(f"lax.{rule.collective}", params.get("axis_index_groups"), axes)
    data = avals[:2] if rule.together else avals  # ragged_all_to_all: its offsets and sizes are not moved as they are
    for x in data:
        try:
            check_dtype(rule.jaxcoll, x.dtype, rule.op)
        except TypeError as e:
            raise Unsupported("dtype", np.dtype(x.dtype).name, str(e)) from None
    if rule.run is _ragged_all_to_all:
        try:
            check_ragged_typing(avals, axes)
        except ValueError as e:
            raise Unsupported("output", f"varying over {sorted(_jax.varying_axes(avals[1]))}", str(e)) from None
    check_algorithm_of(rule, params, data[:1] if rule.together else avals, algorithm)


def check_algorithm_of(rule: Rule, params: dict, avals, algorithm) -> None:
    """Unsupported when `algorithm` (a user's Plan above all) does not fit this call."""
    if rule.run is _pvary:  # its algorithm is the one of the psum it transposes to, checked there
        return
    collective = COLLECTIVES[rule.collective]
    extra = {}
    if rule.collective == "pbroadcast":
        extra["root"] = params["source"]
    if rule.collective == "ppermute":
        extra["perm"] = params["perm"]
    n = groups.group_size(rule.axes(params), params.get("axis_index_groups"))
    for x in avals:
        try:
            check_algorithm(rule.jaxcoll, collective, n, x, algorithm, **extra)
        except ValueError as e:
            raise Unsupported("algorithm", algorithm, str(e)) from None
