"""The interpreter behind `replace_collectives`: evaluates a traced program (a jaxpr) equation by equation under
whatever JAX is tracing at the time, binding jaxcoll's collectives where the program has jax.lax's and every
other primitive as it was.

Constructs with programs inside them are rebuilt around their transformed insides, so collectives are reached
wherever they are:
- shard_map: called again through `jax.shard_map` with the same mesh, specs and typing, on a body that this
  interpreter evaluates (shard_map sets the named axes and varying/invariant typing the body is traced under);
- custom_jvp / custom_vjp: bound with their function and rules wrapped, so the rules (traced when the program
  is differentiated) are transformed too;
- every other primitive that holds jaxprs in its parameters (scan, while, cond, jit, checkpoint, ...): bound
  with those jaxprs re-traced through this interpreter (`jax.make_jaxpr` of the evaluation, on the jaxpr's own
  input types), every other parameter unchanged.
A program transformed before it is differentiated gets jaxcoll in its backward pass through the transposes of
jaxcoll's primitives; one that differentiates inside itself already holds the transposed collectives, which
are replaced like the others.
"""

from __future__ import annotations

import collections
import threading
import warnings
import weakref
from functools import partial

import jax
import numpy as np
from jax.extend import linear_util, source_info_util
from jax.extend.core import ClosedJaxpr, DropVar, Jaxpr, Literal, jaxprs_in_params

from jaxcoll.replace import collectives
from jaxcoll.replace.collectives import ReplacementError, ReplacementWarning
from jaxcoll.replace.options import Options
from jaxcoll.replace.report import Entry, Report


class Session:
    """One trace of a transformed function: its options and the report of what it replaced."""

    def __init__(self, options: Options, report: Report | None = None):
        self.options = options
        self.report = report if report is not None else Report()
        self._captures = threading.local()

    def record(self, entry: Entry) -> None:
        self.report.add(entry)
        for capture in getattr(self._captures, "stack", ()):
            capture.append(entry)

    def capturing(self):
        """A list that collects the entries recorded until `release` (the entries of a cached re-trace)."""
        stack = getattr(self._captures, "stack", None)
        if stack is None:
            stack = self._captures.stack = []
        stack.append([])
        return stack[-1]

    def release(self, capture: list) -> None:
        stack = self._captures.stack
        del stack[next(i for i, c in enumerate(stack) if c is capture)]  # by identity: equal lists are common


def is_array(x) -> bool:
    """Whether `x` is traced as an operand (a JAX or NumPy array, a tracer); anything else passes as it is."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def evaluate(session: Session, closed: ClosedJaxpr, *args, where: str = "") -> list:
    """The outputs of `closed` on `args`, with the collectives replaced as `session.options` say."""
    jaxpr = closed.jaxpr
    env = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    def write(v, x):
        if not isinstance(v, DropVar):
            env[v] = x

    for v, x in zip(jaxpr.constvars, closed.consts):
        write(v, x)
    if len(args) != len(jaxpr.invars):
        raise TypeError(f"replace_collectives: a program of {len(jaxpr.invars)} inputs got {len(args)}")
    for v, x in zip(jaxpr.invars, args):
        write(v, x)
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
        with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
            outvals = _equation(session, eqn, invals, where)
        if not eqn.primitive.multiple_results:
            outvals = [outvals]
        for v, x in zip(eqn.outvars, outvals):
            write(v, x)
    return [read(v) for v in jaxpr.outvars]


def _bind(eqn, invals, params=None, subfuns=None):
    """Bind `eqn`'s primitive on `invals`, as jax's own evaluation of a jaxpr does; `params` replaces the
    equation's, `subfuns` the callables a primitive binds (custom_jvp's function and rule, ...)."""
    own, bind_params = _bind_params(eqn.primitive, eqn.params if params is None else params)
    subfuns = own if subfuns is None else subfuns
    return eqn.primitive.bind(*invals, **bind_params, **({"subfuns": tuple(subfuns)} if subfuns else {}))


def _bind_params(primitive, params) -> tuple[list, dict]:
    """(subfuns, the other parameters) to bind `primitive` with. Primitive.get_bind_params returns the
    parameters, the callables among them as "subfuns" (checked on jax 0.10.2 and 0.12.0.1; before jax 0.7 it
    returned a pair)."""
    bind_params = dict(primitive.get_bind_params(params))
    return list(bind_params.pop("subfuns", ())), bind_params


def _equation(session: Session, eqn, invals, where: str):
    name = eqn.primitive.name
    if name in collectives.RULES or name in collectives.UNSUPPORTED:
        return _collective(session, eqn, invals, where)
    if name == "shard_map" and _has_collectives(eqn.params["jaxpr"]):
        return _shard_map(session, eqn, invals, where)
    if name in ("custom_jvp_call", "custom_vjp_call"):
        return _custom_derivative(session, eqn, invals, where)
    if any(map(_has_collectives, jaxprs_in_params(eqn.params))):
        return _higher_order(session, eqn, invals, where)
    return _bind(eqn, invals)


# -- collectives ------------------------------------------------------------------------------------------------

def _collective(session: Session, eqn, invals, where: str):
    """A jax.lax collective (or one jaxcoll has no counterpart for): replaced, or bound as it was where
    `collectives.replacement` leaves it to XLA."""
    run = collectives.replacement(session.options, eqn.primitive.name, eqn.params, [jax.typeof(x) for x in invals],
                                  where, session.record)
    if run is None:
        return _bind(eqn, invals)
    outs = run(*invals)
    return outs if eqn.primitive.multiple_results else outs[0]


# -- shard_map --------------------------------------------------------------------------------------------------

def _shard_map(session: Session, eqn, invals, where: str):
    params = eqn.params
    manual = params.get("newly_manual_axes", params.get("manual_axes"))
    known = {"jaxpr", "mesh", "in_specs", "out_specs", "check_vma"}
    if manual is None or not known <= set(params):
        return _left_whole(session, eqn, invals, where, "shard_map with parameters this transform does not know: "
                                                          f"{sorted(params)}")
    body = ClosedJaxpr(params["jaxpr"], ())
    inside = _join(where, "shard_map")

    def run(*xs):
        return tuple(evaluate(session, body, *xs, where=inside))

    fn = jax.shard_map(run, mesh=params["mesh"], in_specs=tuple(params["in_specs"]),
                       out_specs=tuple(params["out_specs"]), axis_names=set(manual),
                       check_vma=params["check_vma"])
    return list(fn(*invals))


def _left_whole(session: Session, eqn, invals, where: str, reason: str):
    """An equation whose insides this transform cannot reach: it runs as it was, collectives and all."""
    if session.options.strict:
        raise ReplacementError(f"replace_collectives(strict=True): cannot reach into {eqn.primitive.name}"
                               f"{' in ' + where if where else ''}: {reason}")
    warnings.warn(f"replace_collectives: {eqn.primitive.name}{' in ' + where if where else ''} runs unchanged "
                  f"(its collectives on XLA): {reason}", ReplacementWarning, stacklevel=2)
    session.record(Entry(collective=eqn.primitive.name, primitive=eqn.primitive.name, where=where, axes=(),
                         shape=(), dtype="", replaced=False, reason=reason))
    return _bind(eqn, invals)


# -- custom_jvp / custom_vjp ------------------------------------------------------------------------------------

def _custom_derivative(session: Session, eqn, invals, where: str):
    """custom_jvp_call / custom_vjp_call bind their function and rules as callables (`subfuns`); each is
    wrapped so that whatever it traces is transformed."""
    subfuns, _ = _bind_params(eqn.primitive, eqn.params)
    kind = "custom_jvp" if eqn.primitive.name == "custom_jvp_call" else "custom_vjp"
    roles = ("fun", "jvp") if kind == "custom_jvp" else ("fun", "fwd", "bwd")
    wrapped = [linear_util.wrap_init(transform_callable(session, sub.call_wrapped, _join(where, f"{kind}.{role}")),
                                     debug_info=sub.debug_info)
               for sub, role in zip(subfuns, roles)]
    return _bind(eqn, invals, subfuns=wrapped)


def transform_callable(session: Session, fn, where: str):
    """`fn` with its collectives replaced: traced to a jaxpr on the array leaves of its operands (other leaves pass
    through as they are), then evaluated by this interpreter. Result leaves that are not arrays (symbolic zeros
    of a rule, None) come back as traced, in the structure fn gave (a custom_vjp rule's cotangents are a nested
    list from jax 0.12)."""

    def run(*args):
        leaves, in_tree = jax.tree.flatten(args)
        positions = [i for i, leaf in enumerate(leaves) if is_array(leaf)]
        traced_outs = {}

        def traced(*arrays):
            full = list(leaves)
            for i, a in zip(positions, arrays):
                full[i] = a
            out_leaves, traced_outs["tree"] = jax.tree.flatten(fn(*jax.tree.unflatten(in_tree, full)))
            traced_outs["leaves"] = out_leaves
            return [leaf for leaf in out_leaves if is_array(leaf)]

        closed = jax.make_jaxpr(traced)(*[leaves[i] for i in positions])
        results = iter(evaluate(session, closed, *[leaves[i] for i in positions], where=where))
        out_leaves = [next(results) if is_array(leaf) else leaf for leaf in traced_outs["leaves"]]
        return jax.tree.unflatten(traced_outs["tree"], out_leaves)

    return run


# -- other higher-order primitives ------------------------------------------------------------------------------

_scanned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _has_collectives(jaxpr: Jaxpr) -> bool:
    """Whether `jaxpr` (or one inside it) holds a collective, or a custom rule that may: a construct without
    any is bound as it was, not re-traced (a kernel's jaxpr, say, need not survive make_jaxpr)."""
    found = _scanned.get(jaxpr)
    if found is None:
        found = any(eqn.primitive.name in collectives.RULES or eqn.primitive.name in collectives.UNSUPPORTED
                    or eqn.primitive.name in ("shard_map", "custom_jvp_call", "custom_vjp_call")
                    or any(map(_has_collectives, jaxprs_in_params(eqn.params)))
                    for eqn in jaxpr.eqns)
        _scanned[jaxpr] = found
    return found


def _holds_jaxpr(value) -> bool:
    if isinstance(value, (ClosedJaxpr, Jaxpr)):
        return True
    return isinstance(value, (tuple, list)) and any(_holds_jaxpr(v) for v in value)


_UNREACHABLE = object()  # a parameter's jaxpr that could not be transformed
_ROLES = {("while", "cond_jaxpr"): "while.cond", ("while", "body_jaxpr"): "while.body"}

# Re-traced jaxprs by (jaxpr, options, place): a jit re-bound with the same transformed jaxpr object reuses its
# compiled executable, so a transformed jit called eagerly compiles once, not on every call. Bounded; the
# entry keeps its source jaxpr and options (a Plan's id is in the key) alive, so the ids stay their own.
_retraced: collections.OrderedDict = collections.OrderedDict()
_retraced_lock = threading.Lock()
_RETRACED_MAX = 256


def _higher_order(session: Session, eqn, invals, where: str):
    name = eqn.primitive.name
    label = f"{name}({eqn.params['name']})" if name == "jit" and "name" in eqn.params else name
    params = {}
    for key, value in eqn.params.items():
        place = _join(where, _ROLES.get((name, key), label))
        params[key] = _transform_param(session, value, place)
    if any(v is _UNREACHABLE for v in params.values()):
        return _left_whole(session, eqn, invals, where, "a jaxpr without inputs for its constants got some")
    return _bind(eqn, invals, params)


def _transform_param(session: Session, value, where: str):
    if isinstance(value, ClosedJaxpr):
        return _retrace(session, value, where)
    if isinstance(value, Jaxpr):
        closed = _retrace(session, ClosedJaxpr(value, ()), where)
        # An open jaxpr (checkpoint's) has no place for constants: the re-trace must not create any.
        return closed.jaxpr if not closed.consts else _UNREACHABLE
    if isinstance(value, (tuple, list)) and _holds_jaxpr(value):
        return type(value)(_transform_param(session, v, f"{where}[{i}]") for i, v in enumerate(value))
    return value


def _retrace(session: Session, closed: ClosedJaxpr, where: str) -> ClosedJaxpr:
    key = (id(closed), session.options.key(), where)
    with _retraced_lock:
        hit = _retraced.get(key)
        if hit is not None:
            _retraced.move_to_end(key)
    if hit is not None:
        _, _, new, entries = hit
        for entry in entries:
            session.record(entry)
        return new
    capture = session.capturing()
    try:
        # make_jaxpr takes the jaxpr's own input types (avals, with their varying axes under shard_map), so the
        # transformed jaxpr has the same inputs as the one it replaces.
        new = jax.make_jaxpr(partial(evaluate, session, closed, where=where))(*closed.in_avals)
    finally:
        session.release(capture)
    with _retraced_lock:
        _retraced[key] = (closed, session.options, new, list(capture))  # both alive: their ids are the key
        while len(_retraced) > _RETRACED_MAX:
            _retraced.popitem(last=False)
    return new


def _join(where: str, part: str) -> str:
    return f"{where}/{part}" if where else part
