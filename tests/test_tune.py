"""jaxcoll.tune: predict, register, the tuning file and what "auto" runs, in one process of 8 CPU devices.
Results of every program are compared with jax.lax's collectives."""

import json
import os
import warnings

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxcoll
from jaxcoll import algorithms, tune
from jaxcoll.plan import Buffer, ChunkRef, Collective, Lane, Op, Plan, RankProgram, Step
from jaxcoll.sim import machine
from jaxcoll.tune import choice, file, run
from sharded import memory_after_release, settled_memory

N = 8


@pytest.fixture
def tuning_file(tmp_path, monkeypatch):
    """A tuning file path of this test's own, read afresh (no choice or registration kept from other tests)."""
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("JAXCOLL_TUNING", str(path))
    choice.forget()
    yield path
    choice.forget()


@pytest.fixture
def no_tuning_file(monkeypatch):
    monkeypatch.setenv("JAXCOLL_TUNING", "off")
    choice.forget()
    yield
    choice.forget()


def all_reduce_program(**kw):
    mesh = jax.make_mesh((N,), ("i",))
    f = jax.jit(jax.shard_map(lambda v: jaxcoll.all_reduce(v, "i", **kw), mesh=mesh, in_specs=P("i"),
                              out_specs=P()))
    g = jax.jit(jax.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
    return mesh, f, g


def small_ints(count):
    return (np.arange(count) % 7 - 3).astype(np.float32)


# -- predict --------------------------------------------------------------------------------------------------


def test_predict_prices_every_builtin_and_grows_with_the_size(no_tuning_file):
    for collective in ("all_reduce", "all_gather", "reduce_scatter"):
        for name in algorithms.known(collective):
            if name in ("auto", "hierarchical"):
                continue
            times = [tune.predict(collective, nbytes=s, nranks=N, algorithm=name) for s in (4 << 10, 1 << 20, 64 << 20)]
            assert 0 < times[0] < times[1] < times[2], (collective, name, times)


def test_predict_of_auto_is_the_fastest_candidate_by_the_model(no_tuning_file):
    for nbytes in (4 << 10, 1 << 20, 16 << 20):
        ranked = choice.rank_by_model("all_reduce", N, nbytes)
        auto = tune.predict("all_reduce", nbytes=nbytes, nranks=N)
        assert auto == pytest.approx(ranked[0][0])
        assert all(auto <= s for s, _, _ in ranked)


def test_predict_takes_a_plan_and_the_synthesized_candidates_by_name(no_tuning_file):
    plan = algorithms.builtin(Collective.ALL_REDUCE, "ring", N)
    assert tune.predict("all_reduce", nbytes=1 << 20, nranks=N, algorithm=plan) == \
        tune.predict("all_reduce", nbytes=1 << 20, nranks=N, algorithm="ring")
    assert tune.predict("all_gather", nbytes=1 << 20, nranks=N, algorithm="synth.rhd") > 0


def test_predict_across_processes_charges_the_crossing(no_tuning_file):
    one = tune.predict("all_gather", nbytes=1 << 20, nranks=N, algorithm="direct")
    two = tune.predict("all_gather", nbytes=1 << 20, nranks=N, algorithm="direct", processes=(0,) * 4 + (1,) * 4)
    assert two > one


@pytest.mark.parametrize("kwargs,named", [
    (dict(collective="all_reduce", nbytes=0, nranks=8), "nbytes=0"),
    (dict(collective="all_reduce", nbytes=-4, nranks=8), "nbytes=-4"),
    (dict(collective="all_reduce", nbytes=1.5, nranks=8), "nbytes=1.5"),
    (dict(collective="all_reduce", nbytes=64, nranks=0), "nranks=0"),
    (dict(collective="all_sum", nbytes=64, nranks=8), "collective='all_sum'"),
    (dict(collective="all_reduce", nbytes=64, nranks=8, algorithm="fastest"), "algorithm='fastest'"),
    (dict(collective="all_reduce", nbytes=64, nranks=4, processes=(0, 1)), "processes=(0, 1)"),
])
def test_predict_names_the_argument_and_value_it_rejects(kwargs, named, no_tuning_file):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        tune.predict(**kwargs)


def test_predict_rejects_a_plan_for_another_group_or_collective(no_tuning_file):
    with pytest.raises(ValueError, match="plan for 4 ranks, nranks=8"):
        tune.predict("all_reduce", nbytes=64, nranks=8, algorithm=algorithms.builtin(Collective.ALL_REDUCE, "ring", 4))
    with pytest.raises(ValueError, match="all_gather plan"):
        tune.predict("all_reduce", nbytes=64, nranks=8,
                     algorithm=algorithms.builtin(Collective.ALL_GATHER, "ring", 8))


# -- register -------------------------------------------------------------------------------------------------


def test_a_registered_plan_is_a_candidate_and_auto_runs_it_when_the_model_prefers_it(no_tuning_file):
    # A copy of the model's fastest plan at 4 KiB, under a name that sorts first among equals.
    best = choice.rank_by_model("all_reduce", N, 4 << 10)[0][2]
    mine = Plan(Collective.ALL_REDUCE, N, best.ranks, name="aaa-mine")
    try:
        assert tune.register(mine) == "aaa-mine"
        assert "aaa-mine" in tune.candidates("all_reduce", N)
        assert tune.choose("all_reduce", N, 4 << 10, "float32")[0] == "aaa-mine"
        mesh, f, g = all_reduce_program()
        x = jax.device_put(small_ints(N * 1024), NamedSharding(mesh, P("i")))  # 4 KiB per rank
        np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(g(x)))
    finally:
        tune.unregister("aaa-mine")
    assert "aaa-mine" not in tune.candidates("all_reduce", N)
    assert tune.choose("all_reduce", N, 4 << 10, "float32")[0] != "aaa-mine"


def test_register_names_what_it_rejects(no_tuning_file):
    with pytest.raises(TypeError, match="must be a jaxcoll.plan.Plan"):
        tune.register("two_shot")
    with pytest.raises(ValueError, match="broadcast plan"):
        tune.register(algorithms.builtin(Collective.BROADCAST, "direct", N))
    with pytest.raises(ValueError, match="name='ring'"):
        tune.register(algorithms.builtin(Collective.ALL_REDUCE, "direct", N), name="ring")
    with pytest.raises(ValueError, match="name=''"):
        tune.register(algorithms.builtin(Collective.ALL_REDUCE, "direct", N), name="")
    # A plan whose ranks reduce only their own input: not an all_reduce, and the checker says so.
    def own(r):
        return Step(Op.COPY, (ChunkRef(r, Buffer.INPUT, 0),), (ChunkRef(r, Buffer.OUTPUT, 0),))
    wrong = Plan(Collective.ALL_REDUCE, 2, tuple(RankProgram(1, 1, lanes=(Lane((own(r),)),)) for r in range(2)),
                 name="wrong")
    with pytest.raises(ValueError, match="'wrong' does not compute all_reduce"):
        tune.register(wrong)
    assert "wrong" not in tune.candidates("all_reduce", 2)
    with pytest.raises(KeyError, match="no plan is registered as 'never'"):
        tune.unregister("never")


# -- the tuning file ------------------------------------------------------------------------------------------


def write_file(path, cells, model=None, **overrides):
    data = {"format": file.FORMAT, **file.versions(), "machine": file.machine(),
            "layouts": {"1x8": {"processes": [0] * N, "hosts": None,
                                "model": model if isinstance(model, dict) else
                                (model or machine.MachineModel()).to_json(),
                                "cells": cells}}}
    data.update(overrides)
    path.write_text(json.dumps(data, default=lambda p: p.to_json()))


def cell(choice_name, nbytes=1 << 20, plan=None, collective="all_reduce"):
    return {"collective": collective, "nranks": N, "bytes": nbytes, "dtype": "float32", "choice": choice_name,
            "plan": plan, "seconds": {choice_name: 1e-3}, "default": "two_shot"}


def test_auto_runs_the_tuning_files_choice_for_its_cell_and_the_model_elsewhere(tuning_file):
    model_pick = choice.rank_by_model("all_reduce", N, 1 << 20, the_model=machine.MachineModel())[0][1]
    measured = "ring" if model_pick != "ring" else "direct"
    write_file(tuning_file, [cell(measured)])
    assert tune.choose("all_reduce", N, 1 << 20, "float32")[0] == measured
    assert tune.choose("all_reduce", N, (1 << 20) + 4096, "float32")[0] == measured  # the nearest cell
    assert tune.choose("all_reduce", N, 1 << 24, "float32")[0] != measured or model_pick == measured
    mesh, f, g = all_reduce_program()
    x = jax.device_put(small_ints(N * (1 << 18)), NamedSharding(mesh, P("i")))  # 1 MiB per rank
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(g(x)))


def test_the_compiled_program_names_the_plan_auto_chose(tuning_file):
    write_file(tuning_file, [cell("ring", nbytes=4 << 10)])
    mesh, f, _ = all_reduce_program()
    x = jax.device_put(small_ints(N * 1024), NamedSharding(mesh, P("i")))
    hlo = f.lower(x).compile().as_text()
    assert 'jaxcoll.all_reduce[ring, 8 ranks]"' in hlo  # the custom call's op_name, as profiles show it


def test_a_synthesized_choice_is_named_and_a_registered_one_stored_whole(tuning_file):
    from jaxcoll.tune import registry
    synthesized = registry.candidates("all_reduce", N)["synth.rhd"]
    mine = Plan(Collective.ALL_REDUCE, N, algorithms.builtin(Collective.ALL_REDUCE, "ring", N).ranks, name="mine")
    write_file(tuning_file, [cell("synth.rhd", nbytes=64 << 10), cell("mine", nbytes=1 << 20, plan=mine.to_json())])
    name, chosen = tune.choose("all_reduce", N, 64 << 10, "float32")
    assert name == "synth.rhd" and chosen.num_steps() == synthesized.num_steps()
    name, chosen = tune.choose("all_reduce", N, 1 << 20, "float32")  # not registered here: the file's own plan
    assert name == "mine" and chosen.name == "mine"
    mesh, f, g = all_reduce_program()
    for per_rank in (16 << 10, 1 << 18):  # 64 KiB and 1 MiB of float32
        x = jax.device_put(small_ints(N * per_rank), NamedSharding(mesh, P("i")))
        np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(g(x)))


def test_the_tuning_run_names_each_collectives_plans_apart(tmp_path):
    # Two collectives whose candidates share a name ("synth.direct") and a registered choice of each.
    ag = Plan(Collective.ALL_GATHER, N, algorithms.builtin(Collective.ALL_GATHER, "ring", N).ranks, name="mine")
    rs = Plan(Collective.REDUCE_SCATTER, N, algorithms.builtin(Collective.REDUCE_SCATTER, "ring", N).ranks,
              name="mine")
    cells = [run.Cell(c, N, 1 << 20, "float32", "mine", "direct", "direct", {"mine": [1e-3], "direct": [2e-3]},
                      {"mine": 1e-3, "direct": 2e-3}) for c in ("all_gather", "reduce_scatter")]
    path = tmp_path / "t.json"
    run.write(str(path), "1x8", (0,) * N, None, machine.MachineModel(), cells,
              {("all_gather", "mine"): ag, ("reduce_scatter", "mine"): rs})
    loaded = file.read(str(path))
    assert loaded.cell("1x8", "all_gather", N, 1 << 20, "float32")["plan"].collective is Collective.ALL_GATHER
    assert loaded.cell("1x8", "reduce_scatter", N, 1 << 20, "float32")["plan"].collective is \
        Collective.REDUCE_SCATTER


def test_auto_takes_the_files_calibration_as_its_model(tuning_file):
    slow_steps = machine.MachineModel(step_s=1e-3)
    write_file(tuning_file, [], model=slow_steps)
    assert tune.model((0,) * N) == slow_steps


def broken_plan_json():
    direct = algorithms.builtin(Collective.ALL_REDUCE, "direct", N).to_json()
    step = direct["ranks"][0]["lanes"][0][0]  # rank 0 reduces its own input only
    step["srcs"] = step["srcs"][:1]
    return direct


@pytest.mark.parametrize("damage,reason", [
    (lambda p: p.write_text("{not json"), "is not JSON"),
    (lambda p: p.write_text(json.dumps({"format": "other/9"})), "is not a jaxcoll tuning file"),
    (lambda p: write_file(p, [], machine={"cpu": "elsewhere", "cores": 64, "memory_GiB": 512}),
     "was made on another machine"),
    (lambda p: write_file(p, [], jaxcoll="0.0.1"), "was made with jaxcoll 0.0.1"),
    (lambda p: write_file(p, [], jax="0.4.1"), "jax 0.4.1"),
    (lambda p: write_file(p, [cell("synth.mine", plan=broken_plan_json())]), "fails the checker"),
    (lambda p: write_file(p, [cell("fastest")]), "no built-in or synthesized all_reduce plan"),
    (lambda p: write_file(p, [{"collective": "all_reduce"}]), "is malformed"),
    (lambda p: write_file(p, [], model={"call_s": -1}), "malformed model"),
])
def test_an_unusable_tuning_file_is_ignored_with_one_warning_naming_it_and_why(damage, reason, tuning_file):
    damage(tuning_file)
    with pytest.warns(file.TuningFileWarning) as record:
        name, plan = tune.choose("all_reduce", N, 1 << 20, "float32")
        tune.choose("all_reduce", N, 1 << 21, "float32")  # a second cell: no second warning for the same file
    assert len(record) == 1
    message = str(record[0].message)
    assert str(tuning_file) in message and reason in message, message
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = choice.rank_by_model("all_reduce", N, 1 << 20, the_model=machine.MachineModel(
            threads=choice.model().threads))[0][1]
    assert name == expected  # the model's choice
    mesh, f, g = all_reduce_program()
    x = jax.device_put(small_ints(N * 64), NamedSharding(mesh, P("i")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", file.TuningFileWarning)
        np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(g(x)))


def test_writing_the_file_is_atomic(tuning_file, monkeypatch):
    write_file(tuning_file, [cell("ring")])
    before = tuning_file.read_text()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run.write(str(tuning_file), "1x8", (0,) * N, None, machine.MachineModel(), [], {})
    assert tuning_file.read_text() == before
    assert sorted(os.listdir(tuning_file.parent)) == ["tuning.json"]


def test_a_run_keeps_the_other_layouts_of_the_file(tuning_file):
    write_file(tuning_file, [cell("ring")])
    run.write(str(tuning_file), "2x4", (0,) * 4 + (1,) * 4, None, machine.MachineModel(call_s=1e-4), [], {})
    loaded = file.read(str(tuning_file))
    assert set(loaded.layouts) == {"1x8", "2x4"}
    assert loaded.model("2x4") == machine.MachineModel(call_s=1e-4)
    assert loaded.cell("1x8", "all_reduce", N, 1 << 20, "float32")["choice"] == "ring"


def test_the_setting_off_ignores_the_file(tuning_file, monkeypatch):
    write_file(tuning_file, [cell("ring")])
    monkeypatch.setenv("JAXCOLL_TUNING", "off")
    choice.forget()
    assert file.current() is None


def test_large_groups_leave_the_tree_packings_to_the_tuning_run(no_tuning_file):
    from jaxcoll.tune import registry
    names = registry.candidates("all_gather", 64, tuple(r // 8 for r in range(64)))
    assert "synth.ring" in names and "synth.hierarchical" in names
    assert not any(name.startswith("synth.forest") for name in names)


def test_layout_keys_say_processes_ranks_and_hosts():
    assert file.layout_key((0,) * 8, None) == "1x8"
    assert file.layout_key((0,) * 4 + (1,) * 4, None) == "2x4"
    assert file.layout_key((0,) * 4 + (1,) * 4, (0, 1)) == "2x4/2hosts"
    assert file.layout_key((0, 0, 0, 1), None) == "2x3+1"


def test_the_tuning_run_measures_again_what_is_close_and_prefers_the_steady_plan():
    ms = 1e-3
    times = {"a": [1.00 * ms, 1.01 * ms, 1.02 * ms], "b": [1.05 * ms, 1.06 * ms, 1.07 * ms],
             "c": [2.0 * ms, 2.0 * ms, 2.1 * ms]}
    assert run.contenders(times) == ["a", "b"]  # within 10% of the best median; c is not
    assert run.steadiest(times) == "a"  # a steady best stays the best
    # b's median is 3% above a's, but a is bimodal: its slower calls take 4x
    bimodal = {"a": [1.00 * ms, 1.00 * ms, 1.01 * ms, 4.0 * ms, 4.0 * ms],
               "b": [1.03 * ms, 1.03 * ms, 1.04 * ms, 1.04 * ms, 1.05 * ms]}
    assert run.steadiest(bimodal) == "b"
    # beyond half the margin the median decides, however the faster one spreads
    apart = {"a": [1.00 * ms, 1.00 * ms, 1.0 * ms, 4.0 * ms, 4.0 * ms], "b": [1.08 * ms] * 5}
    assert run.steadiest(apart) == "a"


def test_the_tuning_run_keeps_the_models_pick_unless_it_measured_clearly_slower():
    ms = 1e-3
    times = {"pick": [1.08 * ms] * 3, "other": [1.00 * ms] * 3}
    assert run.decide(times, "pick") == "pick"  # 8% slower: within the noise, the model decides
    times["pick"] = [1.20 * ms] * 3
    assert run.decide(times, "pick") == "other"  # 20% slower: the measurement decides
    assert run.decide(times, "unmeasured") == "other"


def test_cells_visited_in_passes_split_the_calls_and_interleave_the_cells():
    from jaxcoll.tune import measure
    mesh = jax.make_mesh((N,), ("i",))
    visits = []
    cells = [("all_reduce", 4096, {"direct": "direct", "two_shot": "two_shot"}),
             ("all_gather", 16384, {"direct": "direct"})]
    times = measure.time_cells(cells, mesh, reps=5, warmup=1, passes=2, progress=visits.append)
    assert visits == [0, 1, 0, 1]  # every cell in each pass, in turn
    assert [sorted(t) for t in times] == [["direct", "two_shot"], ["direct"]]
    # 5 calls a candidate split 3 + 2 between the visits, each a positive time
    assert all(len(v) == 5 and min(v) > 0 for t in times for v in t.values())
    with pytest.raises(ValueError, match="passes must be between 1 and reps=2, got 3"):
        measure.time_cells(cells, mesh, reps=2, passes=3)


def test_cells_whose_programs_outgrow_the_memory_are_measured_in_groups_each_dropped_before_the_next():
    # Across processes a tuning run of 16 MiB cells held 13-19 GB of segments at once and was killed for memory:
    # every candidate of every cell was compiled before any was timed.
    from jaxcoll import runtime
    from jaxcoll.tune import measure
    mesh = jax.make_mesh((N,), ("i",))
    ring = algorithms.builtin(Collective.ALL_REDUCE, "ring", N)
    direct = algorithms.builtin(Collective.ALL_REDUCE, "direct", N)
    sizes = [256 << 10, 512 << 10, 64 << 10]
    cells = [("all_reduce", size, {"ring": ring, "direct": direct}) for size in sizes]
    # The runtime's own count, against the plans' closed form: the ring's scratch holds one input a rank, direct
    # none; a call site keeps it once or twice (a second rendezvous while the last rank leaves the first call).
    scratch = {size: N * size * ring.ranks[0].scratch_chunks // ring.chunk_factor for size in sizes}
    assert [measure.held_bytes(c[2]["ring"], c[1], "float32") for c in cells] == [2 * scratch[s] for s in sizes]
    held = []
    before = settled_memory()[1]

    def visited(i):
        held.append((i, runtime.communicator_memory()[1] - before))

    # room for the first two cells' programs together, not for all three
    room = sum(measure.buffer_bytes("all_reduce", s, N, N) + 2 * scratch[s] for s in sizes[:2])
    times = measure.time_cells(cells, mesh, reps=2, warmup=1, passes=2, progress=visited, memory=room)
    assert [i for i, _ in held] == [0, 1, 0, 1, 2, 2]
    first, second = scratch[sizes[0]] + scratch[sizes[1]], scratch[sizes[2]]
    for i, b in held:  # the first group's scratch is gone before the last cell is compiled
        low = first if i < 2 else second
        assert low <= b <= 2 * low, (i, b, low)
    assert memory_after_release(before)[1] == before  # the last group's memory went with its programs
    assert all(len(v) == 2 and min(v) > 0 for t in times for v in t.values())


def test_a_cell_that_alone_outgrows_the_memory_is_measured_in_subsets_tied_by_its_first_candidate():
    from jaxcoll import runtime
    from jaxcoll.tune import measure
    mesh = jax.make_mesh((N,), ("i",))
    size = 256 << 10
    plans = {name: algorithms.builtin(Collective.ALL_REDUCE, name, N) for name in ("two_shot", "ring", "direct")}
    plans["ring2"] = plans["ring"]  # another call site of the same plan: it holds its own scratch
    ring = N * size  # the ring's scratch: one input a rank
    room = measure.buffer_bytes("all_reduce", size, N, N) + 2 * ring  # one ring's call site (two calls), no more
    held = []
    before = settled_memory()[1]
    times = measure.time_cells([("all_reduce", size, plans)], mesh, reps=2, warmup=1, passes=1, memory=room,
                               progress=lambda i: held.append(runtime.communicator_memory()[1] - before))
    # two subsets, each led by two_shot: (two_shot, ring, direct), then (two_shot, ring2)
    assert len(held) == 2 and all(ring <= b <= 2 * ring for b in held), (held, ring)
    assert list(times[0]) == list(plans)
    assert [len(v) for v in times[0].values()] == [4, 2, 2, 2]  # the first candidate in both subsets
    assert all(min(v) > 0 for v in times[0].values())


def test_a_program_of_one_call_a_launch_holds_its_call_sites_memory_once():
    # From 1 MiB a rank a measured program runs one call a launch (measure.iterations), each launch awaited: every
    # rank has left the call before its launch ends, so the next launch's call reuses the same rendezvous.
    from jaxcoll import runtime
    from jaxcoll.tune import measure
    mesh = jax.make_mesh((N,), ("i",))
    size = 1 << 20
    assert measure.iterations(size) == 1
    ring = algorithms.builtin(Collective.ALL_REDUCE, "ring", N)
    held = []
    before = settled_memory()[1]
    measure.time_cells([("all_reduce", size, {"ring": ring}), ("all_gather", 4096, {"direct": "direct"})], mesh,
                       reps=3, warmup=1, passes=1, memory=1 << 40,
                       progress=lambda i: held.append(runtime.communicator_memory()[1] - before))
    assert held[0] == N * size  # the ring's scratch, one input a rank, once
    assert measure.held_bytes(ring, size, "float32", calls=1) == N * size


def test_candidate_subsets_fit_the_memory_each_led_by_the_first_candidate():
    from jaxcoll.tune import measure
    held = {"a": 30, "b": 20, "c": 40, "d": 10, "e": 50}
    assert measure.candidate_subsets(list(held), held, 10, 1000) == [list(held)]  # it fits: one subset
    subsets = measure.candidate_subsets(list(held), held, 10, 100)
    assert sorted(subsets) == [["a", "b", "c"], ["a", "d", "e"]]
    assert all(10 + sum(held[k] for k in s) <= 100 for s in subsets)
    # the largest first: two subsets where taking them in order would make three
    other = {"a": 0, "b": 10, "c": 10, "d": 50, "e": 50}
    assert sorted(measure.candidate_subsets(list(other), other, 0, 60)) == [["a", "b", "d"], ["a", "c", "e"]]
    # a pair that alone outgrows the memory is still a subset (cell_groups warns of it)
    assert sorted(measure.candidate_subsets(list(held), held, 10, 40)) == [["a", k] for k in "bcde"]


def test_subsets_of_a_cell_are_tied_together_by_the_first_candidates_times():
    from jaxcoll.tune import measure
    # The machine ran 1.5x slower during the second subset: the true times are a 1.0, b 2.0, c 0.5.
    first = {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0]}
    second = {"a": [1.5, 1.5, 1.5], "c": [0.75, 0.75, 0.75]}
    merged = measure.merge_subsets([first, second], ["a", "b", "c"])
    assert list(merged) == ["a", "b", "c"]
    assert sorted(merged["a"]) == [1.0] * 3 + [1.5] * 3
    overall = 1.25  # the median of a's six calls
    assert merged["b"] == pytest.approx([2.0 * overall / 1.0] * 3)
    assert merged["c"] == pytest.approx([0.75 * overall / 1.5] * 3)
    assert merged["b"][0] / merged["c"][0] == pytest.approx(4.0)  # the true ratio, the drift taken out


def test_cell_groups_keep_each_cell_whole_and_name_one_that_alone_outgrows_the_memory():
    from jaxcoll.tune import measure
    cells = [("all_reduce", 1 << 10, {}), ("all_gather", 1 << 30, {}), ("all_reduce", 1 << 20, {}),
             ("reduce_scatter", 1 << 20, {})]
    with pytest.warns(UserWarning, match=r"candidates of all_gather at 1073741824 B a rank measured together hold "
                                         r"about 0\.0 GiB, more than the 0\.0 GiB"):
        groups = measure.cell_groups([10, 500, 40, 60], 100, cells)
    assert groups == [[0], [1], [2, 3]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measure.cell_groups([10, 20, 30], 100) == [[0, 1, 2]]
