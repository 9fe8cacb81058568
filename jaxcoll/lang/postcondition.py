"""What each collective must leave in every output chunk, stated over symbolic values.

A symbolic value is a multiset (`collections.Counter`) of *contributions*: `(rank, i)` is chunk i of rank r's
input as it was at entry. Reducing two chunks adds their multisets, so "each contribution exactly once" is a
multiset equality, which is exactly what a sum needs (max and min would forgive duplicates; sum does not, so
the checker demands the stricter property). `ZERO` marks a chunk a zero step filled.

A postcondition maps (rank, output chunk index) to the value expected there; `None` means "not constrained"
(a custom collective may leave chunks undefined). A custom plan carries its postcondition in the plan file
(`jaxcoll.plan.Expect`, `Plan.expect`); `stated` turns a Python postcondition into that form.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.ir import ZERO, Collective, Expect, Plan

Postcondition = Callable[[int, int], "Counter | None"]


def value(contributions: Iterable[tuple[int, int]]) -> Counter:
    """The symbolic value holding each (rank, input chunk) of `contributions`."""
    return Counter(tuple(c) for c in contributions)


def describe(v: Counter | None) -> str:
    """A symbolic value as a reader writes it: r0.in[1] + r1.in[1], or 'zeros', or 'nothing'."""
    if v is None:
        return "nothing (never written)"
    if not v:
        return "an empty value"
    parts = []
    for c, n in sorted(v.items(), key=lambda kv: (kv[0] == ZERO, kv[0])):
        term = "zeros" if c == ZERO else f"r{c[0]}.in[{c[1]}]"
        parts.append(term if n == 1 else f"{n}x {term}")
    return " + ".join(parts)


def expected(plan: Plan, custom: Postcondition | None = None) -> Postcondition:
    """The postcondition of `plan`'s collective: a function (rank, output index) -> expected value or None.

    Block b of an output holds chunks b*k .. b*k+k-1; chunk j of a block corresponds to chunk j of the
    matching input block (k = plan.chunk_factor)."""
    n, k = plan.nranks, plan.chunk_factor
    coll = plan.collective
    if custom is not None:
        return custom
    if plan.expect is not None:
        rows = plan.expect.outputs
        return lambda r, i: None if rows[r][i] is None else Counter(rows[r][i])
    if coll is Collective.ALL_REDUCE:
        return lambda r, i: value((s, i) for s in range(n))
    if coll is Collective.ALL_GATHER:
        return lambda r, i: value([(i // k, i % k)])
    if coll is Collective.REDUCE_SCATTER:
        return lambda r, i: value((s, r * k + i) for s in range(n))
    if coll is Collective.ALL_TO_ALL:
        return lambda r, i: value([(i // k, r * k + i % k)])
    if coll is Collective.BROADCAST:
        if not 0 <= plan.root < n:
            raise PlanError(f"broadcast root={plan.root} is out of range for nranks={n}")
        return lambda r, i: value([(plan.root, i)])
    if coll is Collective.PPERMUTE:
        source = {}
        for a, b in plan.perm:
            if not (0 <= a < n and 0 <= b < n):
                raise PlanError(f"ppermute pair ({a}, {b}) is out of range for nranks={n}")
            if b in source:
                raise PlanError(f"ppermute perm sends to rank {b} twice: from {source[b]} and from {a}")
            source[b] = a
        if len({a for a, _ in plan.perm}) != len(plan.perm):
            raise PlanError(f"ppermute perm={list(plan.perm)} sends from one rank twice")
        return lambda r, i: value([(source[r], i)]) if r in source else Counter({ZERO: 1})
    raise PlanError(f"a custom plan ({plan.name or 'unnamed'}) states no postcondition: give it an expect "
                    f"(jaxcoll.plan.Expect; program(..., postcondition=...) fills it in) or pass "
                    f"postcondition=... to jaxcoll.lang.check (see jaxcoll.lang.postcondition)")


def stated(post: Postcondition, nranks: int, output_chunks: int, reduce_op: str = "sum") -> Expect:
    """The plan-file form of a postcondition over `nranks` ranks of `output_chunks` output chunks each."""
    def terms(v):
        return None if v is None else tuple(t for t, m in Counter(v).items() for _ in range(m))
    return Expect(tuple(tuple(terms(post(r, i)) for i in range(output_chunks)) for r in range(nranks)),
                  reduce_op)


def holds(got: Counter | None, want: Counter, reduce_op: str = "sum") -> bool:
    """Whether a chunk's value meets its expected value: as multisets for sum, as sets for the idempotent max
    and min (a contribution reduced in twice changes a sum, not a max)."""
    if got is None:
        return False
    if reduce_op == "sum":
        return got == want
    return set(got) == set(want)
