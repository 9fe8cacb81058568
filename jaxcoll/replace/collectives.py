"""The jax.lax collectives the transform replaces: for each primitive of a traced program (by its name in the
jaxpr), the jax.lax collective it is, the axes it runs over, and the jaxcoll call that runs it instead.

`check` raises `Unsupported` (naming the argument and the value) for a call jaxcoll cannot run as the jaxpr
asks, and the interpreter then leaves that one call to XLA, or raises where the user asked for strict; otherwise
each operand goes through its rule's `run`, which binds jaxcoll's collective.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

import jaxcoll
from jaxcoll.collectives.arguments import check_algorithm
from jaxcoll.lowering import all_gather, all_to_all, groups, pvary
from jaxcoll.lowering.dtypes import check_dtype
from jaxcoll.replace.options import COLLECTIVES


class Unsupported(Exception):
    """This call cannot run on jaxcoll: `argument` has `value`, and `reason` says why."""

    def __init__(self, argument: str, value, reason: str):
        super().__init__(reason)
        self.argument, self.value, self.reason = argument, value, reason


@dataclasses.dataclass(frozen=True)
class Rule:
    """collective: the jax.lax name (the key of `collectives=` and `algorithm=`); jaxcoll: what runs it;
    axes: the equation's axis names from its parameters; run(x, params, algorithm): one operand's result."""

    collective: str
    jaxcoll: str
    axes: Callable[[dict], tuple]
    run: Callable
    op: str | None = None  # the reduction, for the dtype check; None: data movement only


def _names(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _reduction(op):
    return lambda x, p, algorithm: jaxcoll.all_reduce(x, _names(p["axes"]), op=op, algorithm=algorithm)


def _all_gather(invariant: bool):
    def run(x, p, algorithm):
        axes = _names(p["axis_name"])
        if not invariant:
            return jaxcoll.all_gather(x, axes, axis=p["all_gather_dimension"], tiled=p["tiled"],
                                      algorithm=algorithm)
        # lax.all_gather(..., to="invarying"): no public jaxcoll function types its result invariant.
        return all_gather.bind(x, axes=axes, all_gather_dimension=p["all_gather_dimension"], tiled=p["tiled"],
                               algorithm=algorithm, invariant=True)
    return run


def _psum_scatter(x, p, algorithm):
    return jaxcoll.reduce_scatter(x, _names(p["axis_name"]), scatter_dimension=p["scatter_dimension"],
                                  tiled=p["tiled"], algorithm=algorithm)


def _all_to_all(x, p, algorithm):
    # The primitive always has the tiled shape contract (lax.all_to_all adds and drops the unit dimensions of
    # its untiled form around it), so it binds jaxcoll's primitive, which has the same one.
    return all_to_all.bind(x, axes=_names(p["axis_name"]), split_axis=p["split_axis"], concat_axis=p["concat_axis"],
                           algorithm=algorithm)


def _ppermute(x, p, algorithm):
    return jaxcoll.ppermute(x, _names(p["axis_name"]), p["perm"], algorithm=algorithm)


def _pbroadcast(x, p, algorithm):
    return jaxcoll.broadcast(x, _names(p["axis_name"]), root=p["source"], algorithm=algorithm)


def _pvary(x, p, algorithm):
    return pvary.bind(x, axes=_names(p["axes"]), algorithm=algorithm)


_AXES = lambda p: _names(p["axes"])  # noqa: E731
_AXIS_NAME = lambda p: _names(p["axis_name"])  # noqa: E731

# jaxpr primitive name -> rule. Names as jax 0.10.2 to 0.12 write them: lax.psum binds psum_invariant under
# shard_map(check_vma=True) and psum otherwise; lax.all_gather(to="invarying") binds all_gather_invariant;
# lax.psum_scatter binds reduce_scatter; pvary is the invariant->varying cast whose transpose is a psum.
RULES = {
    "psum": Rule("psum", "jaxcoll.all_reduce", _AXES, _reduction("sum"), op="sum"),
    "psum_invariant": Rule("psum", "jaxcoll.all_reduce", _AXES, _reduction("sum"), op="sum"),
    "pmax": Rule("pmax", "jaxcoll.all_reduce(op='max')", _AXES, _reduction("max"), op="max"),
    "pmin": Rule("pmin", "jaxcoll.all_reduce(op='min')", _AXES, _reduction("min"), op="min"),
    "all_gather": Rule("all_gather", "jaxcoll.all_gather", _AXIS_NAME, _all_gather(False)),
    "all_gather_invariant": Rule("all_gather", "jaxcoll.all_gather", _AXIS_NAME, _all_gather(True)),
    "reduce_scatter": Rule("psum_scatter", "jaxcoll.reduce_scatter", _AXIS_NAME, _psum_scatter, op="sum"),
    "all_to_all": Rule("all_to_all", "jaxcoll.all_to_all", _AXIS_NAME, _all_to_all),
    "ppermute": Rule("ppermute", "jaxcoll.ppermute", _AXIS_NAME, _ppermute),
    "pbroadcast": Rule("pbroadcast", "jaxcoll.broadcast", _AXIS_NAME, _pbroadcast),
    "pvary": Rule("psum", "jaxcoll pvary (transpose: jaxcoll.all_reduce)", _AXES, _pvary),
}


# jax.lax collectives jaxcoll has no counterpart for: they run on XLA, with a warning (an error when strict).
UNSUPPORTED = {
    "ragged_all_to_all": "jaxcoll has no ragged all_to_all",
    "psend": "jaxcoll has no point-to-point send (psend/precv); ppermute is its exchange",
    "precv": "jaxcoll has no point-to-point receive (psend/precv); ppermute is its exchange",
    "all_gather_reduced": "jaxcoll has no all_gather to a reduced (unreduced-typed) value",
    "unreduced_psum": "jaxcoll has no psum of unreduced-typed values",
    "unreduced_reduce_scatter": "jaxcoll has no reduce_scatter of unreduced-typed values",
    **{f"{name}_start": "jaxcoll has no asynchronous (start/done) collectives" for name in (
        "all_gather", "all_gather_reduced", "psum", "psum_invariant", "unreduced_psum", "reduce_scatter",
        "unreduced_reduce_scatter", "all_to_all", "pbroadcast", "ppermute")},
}


def label(primitive: str) -> str:
    """The name a report shows for a primitive: the lax collective, or "pvary" for the cast."""
    return "pvary" if primitive == "pvary" else RULES[primitive].collective


def check(rule: Rule, params: dict, operands, algorithm) -> None:
    """Unsupported unless jaxcoll can run this call as its parameters ask."""
    index_groups = params.get("axis_index_groups")
    if index_groups is not None:
        raise Unsupported("axis_index_groups", index_groups,
                          "jaxcoll's groups are the combinations of the mesh's other axes; it cannot form "
                          "arbitrary groups of one axis")
    axes = rule.axes(params)
    positional = [a for a in axes if isinstance(a, int)]
    if positional:
        raise Unsupported("axis_name", axes, "positional (integer) axes are not mesh axes")
    from jax.sharding import get_abstract_mesh
    mesh_axes = set(get_abstract_mesh().axis_names)
    if any(a in mesh_axes for a in axes) and not all(a in mesh_axes for a in axes):
        raise Unsupported("axis_name", axes, "it mixes vmap axes with mesh axes, which jaxcoll's batching rules "
                                             "do not split")
    for x in operands:
        try:
            check_dtype(rule.jaxcoll, x.dtype, rule.op)
        except TypeError as e:
            raise Unsupported("dtype", np.dtype(x.dtype).name, str(e)) from None
    check_algorithm_of(rule, params, operands, algorithm)


def check_algorithm_of(rule: Rule, params: dict, operands, algorithm) -> None:
    """Unsupported when `algorithm` (a user's Plan above all) does not fit this call."""
    if rule.run is _pvary:  # its algorithm is the one of the psum it transposes to, checked there
        return
    collective = COLLECTIVES[rule.collective]
    extra = {}
    if rule.collective == "pbroadcast":
        extra["root"] = params["source"]
    if rule.collective == "ppermute":
        extra["perm"] = params["perm"]
    n = groups.group_size(rule.axes(params))
    for x in operands:
        try:
            check_algorithm(rule.jaxcoll, collective, n, x, algorithm, **extra)
        except ValueError as e:
            raise Unsupported("algorithm", algorithm, str(e)) from None
