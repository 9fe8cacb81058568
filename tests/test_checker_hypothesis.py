"""Property tests of the checker: randomly generated programs compile to plans it proves, and mutations of
those plans (drop a step, change an index, drop a signal, swap a step with the wait before it) are rejected."""

import dataclasses
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxcoll.lang import PlanError, check, chunk, program
from jaxcoll.plan import ChunkRef, Lane, Op

SETTINGS = settings(max_examples=int(os.environ.get("JAXCOLL_HYPOTHESIS_EXAMPLES", 60)), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def programs(draw):
    """A random all-reduce or all-gather: per chunk a random reduction chain and a random broadcast tree, each
    hop a put or a get, on random or automatic lanes, with random instances, pipelining and fusion."""
    n = draw(st.integers(2, 5))
    k = draw(st.integers(1, 3))
    coll = draw(st.sampled_from(["all_reduce", "all_gather"]))
    lane = st.one_of(st.none(), st.integers(0, 2))
    via = st.sampled_from(["put", "get"])
    with program("random", coll, n, chunks=k, instances=draw(st.integers(1, 2)),
                 pipeline=draw(st.integers(1, 2)), fuse=draw(st.booleans())) as p:
        for c in range(k):
            blocks = range(n) if coll == "all_gather" else [None]
            for b in blocks:
                order = draw(st.permutations(range(n)))
                if coll == "all_reduce":
                    out = c
                    cur = chunk(order[0], "input", c)
                    for r in order[1:]:
                        cur = cur.copy(r, "acc", c, via=draw(via), lane=draw(lane))
                        cur.reduce(chunk(r, "input", c), lane=draw(lane))
                    holder = cur.copy(order[-1], "output", out, lane=draw(lane))
                else:
                    out = b * k + c
                    order = [b] + [r for r in order if r != b]
                    holder = chunk(b, "input", c).copy(b, "output", out, lane=draw(lane))
                have = [holder]
                for r in order:
                    if r == holder.rank:
                        continue
                    src = have[draw(st.integers(0, len(have) - 1))]
                    have.append(src.copy(r, "output", out, via=draw(via), lane=draw(lane)))
    return p.plan(check=False)


def replace_steps(plan, rank, lane, steps):
    ranks = list(plan.ranks)
    lanes = list(ranks[rank].lanes)
    lanes[lane] = Lane(tuple(steps))
    ranks[rank] = dataclasses.replace(ranks[rank], lanes=tuple(lanes))
    return dataclasses.replace(plan, ranks=tuple(ranks))


def positions(plan, pred):
    return [(r, l, i) for r, l, i, s in plan.steps() if pred(s)]


@SETTINGS
@given(programs())
def test_generated_plans_are_proved(plan):
    check(plan)


def _mutate(plan, data, kind):
    if kind == "drop_step":
        cands = positions(plan, lambda s: s.op.is_data)
    elif kind == "drop_signal":
        cands = positions(plan, lambda s: s.op is Op.SIGNAL)
    elif kind == "change_index":
        cands = positions(plan, lambda s: s.op.is_data)
    else:  # swap a data step with the wait just before it
        cands = [(r, l, i) for r, l, i, s in plan.steps()
                 if s.op.is_data and i > 0 and plan.ranks[r].lanes[l].steps[i - 1].op is Op.WAIT]
    if not cands:
        return None
    r, l, i = data.draw(st.sampled_from(cands))
    steps = list(plan.ranks[r].lanes[l].steps)
    if kind in ("drop_step", "drop_signal"):
        del steps[i]
    elif kind == "change_index":
        s = steps[i]
        refs = s.srcs + s.dsts
        j = data.draw(st.integers(0, len(refs) - 1))
        old = refs[j]
        delta = data.draw(st.integers(1, 3))
        new = ChunkRef(old.rank, old.buffer, old.index + delta, old.count)
        refs = refs[:j] + (new,) + refs[j + 1:]
        steps[i] = dataclasses.replace(s, srcs=refs[:len(s.srcs)], dsts=refs[len(s.srcs):])
    else:
        steps[i - 1], steps[i] = steps[i], steps[i - 1]
    return replace_steps(plan, r, l, steps)


@pytest.mark.parametrize("kind", ["drop_step", "drop_signal", "change_index", "swap_wait"])
@SETTINGS
@given(plan=programs(), data=st.data())
def test_mutated_plans_are_rejected(kind, plan, data):
    try:
        mutant = _mutate(plan, data, kind)
    except PlanError:
        return  # the mutant is malformed already (e.g. an index out of range): rejected at construction
    if mutant is None:
        return
    with pytest.raises(PlanError):
        check(mutant)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(1, 40))
def test_proved_plans_compute_their_collective_on_the_executor(plan, per_block):
    runtime = pytest.importorskip("jaxcoll.runtime", exc_type=ImportError)
    import numpy as np
    check(plan)
    xs = [np.arange(per_block, dtype=np.float32) * (r + 1) + r for r in range(plan.nranks)]
    got = runtime.run_plan(plan, xs)
    want = np.sum(xs, axis=0) if plan.collective.value == "all_reduce" else np.concatenate(xs)
    for g in got:
        np.testing.assert_array_equal(g, want)
