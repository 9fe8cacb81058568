"""The options of `replace_collectives`: which jax.lax collectives to replace, the algorithm each runs, strict or
falling back to XLA, whether to print the report. Checked when the transform is made, each error naming the
argument and the value; `replacing_collectives` sets defaults for the transforms traced inside it."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Mapping

from jaxcoll.plan import Collective, Plan

# The jax.lax collectives the transform replaces, by the name a user knows them by, and the jaxcoll collective
# each becomes. pmean is psum then a division in the traced program, so "psum" covers it.
COLLECTIVES = {
    "psum": Collective.ALL_REDUCE,
    "pmax": Collective.ALL_REDUCE,
    "pmin": Collective.ALL_REDUCE,
    "all_gather": Collective.ALL_GATHER,
    "psum_scatter": Collective.REDUCE_SCATTER,
    "all_to_all": Collective.ALL_TO_ALL,
    "ragged_all_to_all": Collective.ALL_TO_ALL,
    "ppermute": Collective.PPERMUTE,
    "pbroadcast": Collective.BROADCAST,
}

_ALIASES = {"pmean": "psum", "reduce_scatter": "psum_scatter"}


@dataclasses.dataclass(frozen=True)
class Options:
    """What `replace_collectives` does. `algorithms` maps each replaced collective to "auto", a built-in name or
    a Plan; collectives left out of `collectives` run XLA's."""

    collectives: frozenset = frozenset(COLLECTIVES)
    algorithms: Mapping = dataclasses.field(default_factory=lambda: {name: "auto" for name in COLLECTIVES})
    strict: bool = False
    report: bool = False

    def algorithm(self, name: str):
        return self.algorithms.get(name, "auto")

    def key(self) -> tuple:
        """A hashable summary (Plans hash by identity), for caching what was transformed with these options."""
        return (self.collectives, tuple(sorted((k, v if isinstance(v, str) else id(v))
                                                for k, v in self.algorithms.items())), self.strict)


def _name(name, argument: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"replace_collectives: {argument} must name jax.lax collectives, got {name!r}")
    name = _ALIASES.get(name, name)
    if name not in COLLECTIVES:
        raise ValueError(f"replace_collectives: {argument} names {name!r}, which is not a collective the transform "
                         f"replaces; known: {', '.join(map(repr, COLLECTIVES))} (pmean is psum)")
    return name


def _collectives(value) -> frozenset:
    if value is None or value == "all":
        return frozenset(COLLECTIVES)
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Iterable):
        raise TypeError(f"replace_collectives: collectives={value!r} must be 'all' or a collection of names")
    return frozenset(_name(n, "collectives") for n in value)


def _algorithms(value) -> dict:
    """Every collective's algorithm from `algorithm=`: None ("auto" for all), one name (for every collective that
    has an algorithm of that name, "auto" for the others), or a dict from collective to name or Plan."""
    from jaxcoll import algorithms
    out = {name: "auto" for name in COLLECTIVES}
    if value is None or value == "auto":
        return out
    if isinstance(value, str):
        takers = [n for n, c in COLLECTIVES.items() if value in algorithms.known(c)]
        if not takers:
            known = sorted({a for c in set(COLLECTIVES.values()) for a in algorithms.known(c)})
            raise ValueError(f"replace_collectives: algorithm={value!r} is not an algorithm of any collective; "
                             f"known: {', '.join(map(repr, known))}")
        out.update({n: value for n in takers})
        return out
    if not isinstance(value, Mapping):
        raise TypeError(f"replace_collectives: algorithm={value!r} must be None, an algorithm name, or a dict from "
                        f"collective name to algorithm name or jaxcoll.plan.Plan")
    for key, algorithm in value.items():
        name = _name(key, "algorithm")
        collective = COLLECTIVES[name]
        if isinstance(algorithm, Plan):
            if algorithm.collective is not collective:
                raise ValueError(f"replace_collectives: algorithm[{key!r}] is a {algorithm.collective.value} plan, "
                                 f"but {name} runs as {collective.value}")
        elif algorithm not in algorithms.known(collective):
            raise ValueError(f"replace_collectives: algorithm[{key!r}]={algorithm!r} is not known for {name} "
                             f"({collective.value}); known: {', '.join(map(repr, algorithms.known(collective)))}, "
                             f"or a jaxcoll.plan.Plan")
        out[name] = algorithm
    return out


class _Unset:
    """An argument not given (None is a value of algorithm=): it takes the enclosing context's, else the default."""

    def __repr__(self):
        return "<unset>"


UNSET = _Unset()
_defaults: contextvars.ContextVar[dict] = contextvars.ContextVar("jaxcoll_replace_defaults", default={})


def make(collectives=UNSET, algorithm=UNSET, strict=UNSET, report=UNSET) -> Options:
    """Options from the arguments of `replace_collectives`; an argument not given takes the value of the
    innermost `replacing_collectives` context, else its default."""
    given = {k: v for k, v in dict(collectives=collectives, algorithm=algorithm, strict=strict,
                                   report=report).items() if v is not UNSET}
    values = {**_defaults.get(), **given}
    for flag in ("strict", "report"):
        if not isinstance(values.get(flag, False), bool):
            raise TypeError(f"replace_collectives: {flag}={values[flag]!r} must be True or False")
    return Options(collectives=_collectives(values.get("collectives")),
                   algorithms=_algorithms(values.get("algorithm")),
                   strict=values.get("strict", False), report=values.get("report", False))


@contextlib.contextmanager
def defaults(**values):
    """Within the block, `replace_collectives` transforms traced there take these options unless given their
    own. The values are checked on entry."""
    values = {k: v for k, v in values.items() if v is not UNSET}
    make(**{**_defaults.get(), **values})  # fail on entry, naming the bad argument
    token = _defaults.set({**_defaults.get(), **values})
    try:
        yield
    finally:
        _defaults.reset(token)
