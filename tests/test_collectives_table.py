"""Each collective is one table entry (jaxcoll.plan.collectives) that the C++ side (csrc/collectives.hpp, as
compiled into the native module) mirrors: a collective added to one side only, or an entry that differs, fails
here (docs/plan-ir.md, "Adding a collective")."""

import pytest

from jaxcoll import _jaxcoll
from jaxcoll.plan import Collective, PlanError, default_blocks, encode
from jaxcoll.plan.collectives import TABLE, InPlace, definition, from_code

NATIVE = _jaxcoll.abi()["collectives"]


def test_every_collective_has_a_table_entry():
    assert set(TABLE) == set(Collective)
    assert all(entry.collective is c for c, entry in TABLE.items())


def test_wire_codes_are_the_documented_ones():
    # docs/plan-ir.md, "Serialized form": compiled programs carry these codes, so they never change.
    assert {c.value: entry.code for c, entry in TABLE.items()} == {
        "all_reduce": 0, "all_gather": 1, "reduce_scatter": 2, "all_to_all": 3, "broadcast": 4, "ppermute": 5,
        "custom": 6}


def test_the_native_table_lists_the_python_collectives_in_code_order():
    assert [(d["code"], d["name"]) for d in NATIVE] == sorted((e.code, c.value) for c, e in TABLE.items())


@pytest.mark.parametrize("collective", list(Collective), ids=lambda c: c.value)
def test_the_native_entry_is_the_python_entry(collective):
    entry, native = TABLE[collective], NATIVE[TABLE[collective].code]
    assert native["in_place"] == entry.in_place.value
    assert native["reduces"] == entry.reduces
    assert native["plan_states"] == entry.plan_states
    assert [tuple(b) for b in native["blocks"]] == [entry.blocks(n) for n in range(1, len(native["blocks"]) + 1)]


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_block_counts_are_the_documented_ones(n):
    # docs/plan-ir.md, "Chunks and sizes".
    assert {c.value: default_blocks(c, n) for c in Collective} == {
        "all_reduce": (1, 1), "all_gather": (1, n), "reduce_scatter": (n, 1), "all_to_all": (n, n),
        "broadcast": (1, 1), "ppermute": (1, 1), "custom": (1, 1)}


def test_in_place_aliasing_is_msccls():
    # docs/plan-ir.md, "What the executor guarantees around a plan".
    assert {c.value: e.in_place for c, e in TABLE.items()} == {
        "all_reduce": InPlace.SAME, "all_gather": InPlace.INPUT_IN_OUTPUT, "reduce_scatter": InPlace.OUTPUT_IN_INPUT,
        "all_to_all": InPlace.SAME, "broadcast": InPlace.SAME, "ppermute": InPlace.SAME, "custom": InPlace.SAME}


def test_names_in_the_formats_of_the_field():
    # msccl-tools' <algo coll=...> and MSCCL++'s execution plan "collective" (ppermute is its sendrecv).
    assert {c.value: (e.msccl, e.mscclpp) for c, e in TABLE.items()} == {
        "all_reduce": ("allreduce", "allreduce"), "all_gather": ("allgather", "allgather"),
        "reduce_scatter": ("reducescatter", "reducescatter"), "all_to_all": ("alltoall", "alltoall"),
        "broadcast": ("broadcast", "broadcast"), "ppermute": ("ppermute", "sendrecv"), "custom": ("custom", "custom")}


def test_only_custom_plans_state_their_meaning():
    assert [c for c, e in TABLE.items() if e.plan_states] == [Collective.CUSTOM]
    assert {c.value: e.params for c, e in TABLE.items() if e.params} == {"broadcast": ("root",),
                                                                         "ppermute": ("perm",)}


def test_an_unknown_collective_is_an_error_naming_it():
    with pytest.raises(PlanError, match=r"unknown collective 'reduce'; known: all_reduce, "):
        definition("reduce")
    with pytest.raises(PlanError, match=r"unknown collective 'reduce'"):
        default_blocks("reduce", 4)
    with pytest.raises(PlanError, match=r"unknown collective code 7; known: 0 \(all_reduce\)"):
        from_code(7)


def test_the_serialized_plan_carries_the_table_code():
    from jaxcoll.algorithms import direct
    for build in (direct.all_reduce, direct.all_gather, direct.reduce_scatter, direct.all_to_all):
        plan = build(4)
        assert encode(plan)[2] == TABLE[plan.collective].code
