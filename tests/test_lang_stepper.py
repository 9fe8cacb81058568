"""The one interpreter of semaphores and barriers (`jaxcoll.lang.stepper`), on examples worked out by hand, and
the checker's schedule and the picture's rounds that run on it."""

import pytest

from jaxcoll.lang import check
from jaxcoll.lang.check import schedule
from jaxcoll.lang.picture import rounds
from jaxcoll.lang.stepper import DATA, Stepper, Sync, for_plan
from jaxcoll.plan import Collective, Op, Plan, RankProgram, Step
from test_lang_plans import IN, OUT, lane, put, ref, signal, wait

D = "data"  # a step the stepper only counts


def of_steps(lanes):
    """A stepper whose steps are their own `Sync` (or D for a data step)."""
    return Stepper(lanes, lambda key, step: DATA if step == D else step)


def greedy(stepper):
    """Each lane in turn as far as it can go, until none can: the checker's order."""
    order, progress = [], True
    while progress:
        progress = False
        for key in stepper.lanes:
            done = stepper.run(key)
            order += done
            progress |= bool(done)
    return order


@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_token_passed_round_a_ring_completes_lane_after_lane(n):
    # lane 0 sends the token to lane 1 and waits for it to come back; lane i waits for it and passes it on
    lanes = {0: [Sync(signals=[1]), Sync(waits=[0])]}
    for i in range(1, n):
        lanes[i] = [Sync(waits=[i]), Sync(signals=[(i + 1) % n])]
    want = [(0, 0)] + [(i, j) for i in range(1, n) for j in (0, 1)] + [(0, 1)]
    stepper = of_steps(lanes)
    assert greedy(stepper) == want
    assert stepper.unfinished() == [] and all(v == 0 for v in stepper.signals.values())


def test_a_barrier_completes_for_every_lane_when_the_last_arrives():
    bar = Sync(barrier="b", parties=3)
    stepper = of_steps({"x": [bar, D], "y": [bar], "z": [D, bar]})
    assert stepper.step("x") == [] and stepper.blocked("x")  # arrived: it waits there
    assert stepper.step("x") == []  # a lane waiting at the barrier does not move
    assert stepper.step("y") == [] and stepper.blocked("y")
    assert stepper.step("z") == [("z", 0)]
    assert stepper.step("z") == [("x", 0), ("y", 0), ("z", 1)]
    assert stepper.pc == {"x": 1, "y": 1, "z": 2}
    assert not stepper.blocked("x") and stepper.blocked("y")  # y has finished


def test_a_wait_takes_every_signal_it_names_at_once():
    # a wait on semaphores a (twice) and b, as an MSCCL++ wait names several channels
    stepper = of_steps({"w": [Sync(waits=["a", "b", "a"])], "s": [Sync(signals=["a"]), Sync(signals=["b"]),
                                                                   Sync(signals=["a"])]})
    for _ in range(3):
        assert stepper.blocked("w")
        stepper.step("s")
    assert not stepper.blocked("w")
    assert stepper.step("w") == [("w", 0)]
    assert stepper.signals == {"a": 0, "b": 0}


def test_lanes_that_wait_for_each_other_first_are_left_unfinished():
    stepper = of_steps({"p": [Sync(waits=["p"]), Sync(signals=["q"])], "q": [Sync(waits=["q"]), Sync(signals=["p"])]})
    assert greedy(stepper) == []
    assert stepper.unfinished() == [("p", 0), ("q", 0)]


def test_run_stops_before_the_data_step_past_its_limit():
    stepper = of_steps({"a": [D, Sync(signals=["s"]), D, D]})
    assert stepper.run("a", data_steps=1) == [("a", 0), ("a", 1)]  # the signal after it is free
    assert stepper.run("a", data_steps=1) == [("a", 2)]
    assert stepper.run("a", steps=5) == [("a", 3)]


def relay_broadcast(n):
    """Broadcast from rank n-1 down a chain: rank i waits for rank i+1's put into its output, then puts it on
    to rank i-1. Rank n-1 puts first, signals, then copies its own input to its output."""
    progs = [RankProgram(1, 1, semaphores=1, lanes=(lane(wait()),))]
    for i in range(1, n - 1):
        progs.append(RankProgram(1, 1, semaphores=1, lanes=(lane(
            wait(), put(ref(i, OUT, 0), ref(i - 1, OUT, 0)), signal(i - 1)),)))
    progs.append(RankProgram(1, 1, lanes=(lane(
        put(ref(n - 1, IN, 0), ref(n - 2, OUT, 0)), signal(n - 2),
        Step(Op.COPY, (ref(n - 1, IN, 0),), (ref(n - 1, OUT, 0),))),)))
    return Plan(Collective.BROADCAST, n, tuple(progs), root=n - 1, name=f"relay{n}")


@pytest.mark.parametrize("n", [2, 3, 6])
def test_schedule_and_rounds_of_a_relay_follow_the_chain(n):
    plan = check(relay_broadcast(n))
    # lanes are visited in rank order, so each hop down the chain waits for the next pass
    assert schedule(plan) == ([(n - 1, 0, i) for i in range(3)] + [(r, 0, i) for r in range(n - 2, 0, -1)
                                                                    for i in range(3)] + [(0, 0, 0)])
    # rank r's put in round n-1-r; the root's copy, its second data step, in round 1
    want = {(r, 0, 1): n - 1 - r for r in range(1, n - 1)}
    want[n - 1, 0, 0] = 0
    want[n - 1, 0, 2] = 1
    assert rounds(plan) == want


def test_a_plan_stepper_keys_lanes_by_rank_and_lane_and_semaphores_by_rank():
    plan = relay_broadcast(3)
    stepper = for_plan(plan)
    assert list(stepper.lanes) == [(0, 0), (1, 0), (2, 0)]
    stepper.run((2, 0))
    assert stepper.signals == {(1, 0): 1}
