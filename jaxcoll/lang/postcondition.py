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
from jaxcoll.plan.collectives import definition
from jaxcoll.plan.ir import ZERO, Expect, Plan

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

    `custom` overrides it; else a custom plan's `expect`; else the collective's own (its entry in
    `jaxcoll.plan.collectives`, stated at chunk granularity: block b of an output holds chunks b*k .. b*k+k-1,
    chunk j of a block corresponds to chunk j of the matching input block, k = plan.chunk_factor)."""
    if custom is not None:
        return custom
    if plan.expect is not None:
        rows = plan.expect.outputs
        return lambda r, i: None if rows[r][i] is None else Counter(rows[r][i])
    entry = definition(plan.collective)
    if entry.postcondition is not None:
        contributions = entry.postcondition(plan.nranks, plan.chunk_factor, plan.root, plan.perm)

        def post(r: int, i: int) -> Counter | None:
            terms = contributions(r, i)
            return None if terms is None else value(terms)
        return post
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
