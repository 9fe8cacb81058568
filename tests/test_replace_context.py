"""jaxcoll.replacing_collectives, the context form of the transform: inside the block every jax.lax collective
that JAX lowers runs on jaxcoll, in programs that were never transformed (the backward pass included); after it
the same programs compile to XLA's collectives again.

Every comparison is with the same program compiled outside the block, by XLA (for pbroadcast, which XLA:CPU
cannot lower, with the program replace_cases.xla_reference gives). Inputs are small integers held in
float32, so sums are exact whatever the reduction order and the comparisons are bitwise.
"""

import logging
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxcoll import _jax
from jaxcoll.replace import ReplacementError, ReplacementWarning, replace_collectives, replacing_collectives
from jaxcoll.replace.lowering import primitives
from replace_cases import (CASES, every_collective, first_rank, gathered_row, ints, jaxcoll_calls, point_to_point,
                           skip_reason, spmd, xla_collectives, xla_reference)
from sharded import MESH_AXES, mesh, put, small_ints


def compiled(program, *args) -> str:
    return program.lower(*args).compile().as_text()


def jit_spmd(fn, mesh_name, *, check_vma=True):
    """jit(shard_map(fn)), every input and output split over all mesh axes along the leading dimension."""
    return jax.jit(spmd(fn, mesh_name, check_vma=check_vma))


# -- values and the compiled program --------------------------------------------------------------------------

@pytest.mark.parametrize("mesh_name,axis_name", [m for m in MESH_AXES if m[0] in ("1d8", "2x4")])
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_collective_gives_lax_results_and_compiles_to_jaxcoll_in_the_block(case, mesh_name, axis_name):
    if skip_reason(case, mesh_name, axis_name):
        pytest.skip(skip_reason(case, mesh_name, axis_name))
    x = ints((8, 8, 8), mesh_name)
    program = jit_spmd(first_rank(CASES[case](axis_name, mesh_name)), mesh_name)
    xla = jit_spmd(first_rank(xla_reference(case, mesh_name, axis_name)), mesh_name)
    expected = xla(x)
    with replacing_collectives() as report:
        got = program(x)
        text = compiled(program, x)
    np.testing.assert_array_equal(got, expected)
    assert xla_collectives(text) == [] and jaxcoll_calls(text)
    assert report.entries and not report.left_to_xla, report


def test_every_collective_of_one_program_and_xla_again_after_the_block():
    x = ints((8, 8, 8), "2x4")
    fn = every_collective(gathered_row)  # XLA:CPU cannot lower pbroadcast, and this program compiles outside too
    program = jit_spmd(fn, "2x4")
    expected = program(x)  # compiled before the block: the block must not run this executable
    before = compiled(program, x)
    with replacing_collectives():
        got = program(x)
        inside = compiled(program, x)
    after_value, after = program(x), compiled(program, x)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(after_value, expected)
    assert xla_collectives(inside) == []
    assert jaxcoll_calls(inside) == {"jaxcoll_all_reduce", "jaxcoll_all_gather", "jaxcoll_reduce_scatter",
                                     "jaxcoll_all_to_all", "jaxcoll_ppermute"}
    for text in (before, after):
        assert set(xla_collectives(text)) == {"all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                                              "collective-permute"} and not jaxcoll_calls(text)


def test_a_jit_function_recompiles_on_entering_and_on_leaving_the_block(caplog):
    x = ints((8, 4), "1d8")
    program = jit_spmd(lambda v: lax.psum(v, "i"), "1d8")
    program(x)

    def call_compiles() -> bool:
        caplog.clear()
        with caplog.at_level(logging.WARNING), jax.log_compiles():
            program(x)
        return any("Compiling" in r.getMessage() for r in caplog.records)
    assert not call_compiles()  # the control: called again, a jit function runs the executable it has
    with replacing_collectives() as report:
        assert call_compiles() and len(report.entries) == 1  # the call lowered its psum again, in the block
        assert not call_compiles() and len(report.entries) == 1  # then keeps the executable compiled in it
    assert call_compiles()


def test_pbroadcast_which_xla_cpu_cannot_lower_runs_in_the_block():
    x = ints((8, 4), "1d8")
    program = jit_spmd(lambda v: lax.pbroadcast(v, "i", 5), "1d8")
    with pytest.raises(NotImplementedError):
        program.lower(x)
    with replacing_collectives():
        got = program(x)
    np.testing.assert_array_equal(got, np.broadcast_to(np.asarray(x)[5], (8, 4)))
    with pytest.raises(NotImplementedError):  # jax's lack of a CPU rule is back too
        program.lower(x)


def test_psum_of_a_tuple_and_of_an_invariant_value_and_other_dtypes():
    def fn(v):
        a, b = lax.psum((v, 2 * v), ("x", "y"))
        c = lax.psum(jnp.ones((), v.dtype), "y")  # an invariant value: N equal copies summed
        return a + b + c, lax.pmax(v, "x"), lax.all_gather(v, ("x", "y"), tiled=True)
    for dtype in (np.float32, np.int32, np.int8, jnp.bfloat16):
        x = ints((8, 4), "2x4", dtype)
        program = jit_spmd(fn, "2x4")
        expected = program(x)
        with replacing_collectives() as report:
            got, text = program(x), compiled(program, x)
        jax.tree.map(np.testing.assert_array_equal, got, expected)
        assert xla_collectives(text) == [] and not report.left_to_xla, (dtype, report)


def test_without_check_vma_and_eagerly_without_jit():
    x = ints((8, 4), "2x4")
    fn = lambda v: lax.psum(v, "y") + lax.all_gather(v, "x", tiled=True)[:1] + lax.pmean(v, ("x", "y"))  # noqa
    program = jax.shard_map(fn, mesh=mesh("2x4"), in_specs=P(("x", "y")), out_specs=P(("x", "y")),
                            check_vma=False)
    expected = jax.jit(program)(x)
    with replacing_collectives() as report:
        got = program(x)
    np.testing.assert_array_equal(got, expected)
    assert sorted(e.primitive for e in report.replaced) == ["all_gather", "psum", "psum"]


def test_collectives_inside_scan_cond_and_remat():
    x = ints((8, 4), "1d8")

    def fn(v):
        step = jax.checkpoint(lambda c: c + lax.psum(c, "i"))
        v, _ = lax.scan(lambda c, _: (step(c), None), v, None, length=2)
        return lax.cond(v.sum() > 0, lambda u: lax.pmax(u, "i"), lambda u: lax.pmin(u, "i"), v)
    program = jit_spmd(fn, "1d8")
    expected = program(x)
    with replacing_collectives() as report:
        got, text = program(x), compiled(program, x)
    np.testing.assert_array_equal(got, expected)
    assert xla_collectives(text) == []
    assert {e.collective for e in report.replaced} == {"psum", "pmax", "pmin"}


# -- the backward pass --------------------------------------------------------------------------------------------

def test_grad_runs_its_transposed_psum_on_jaxcoll():
    x = ints((8, 4), "2x4")
    w = jnp.asarray(small_ints(np.random.default_rng(1), (4,), np.float32))

    def loss(w):
        body = lambda v, w: lax.psum(jnp.sum(v * w), ("x", "y"))  # noqa: E731 (w invariant: its cotangent is psummed)
        return jax.shard_map(body, mesh=mesh("2x4"), in_specs=(P(("x", "y")), P()), out_specs=P())(x, w)
    grad = jax.jit(jax.grad(loss))
    expected = grad(w)
    assert xla_collectives(compiled(grad, w)) == ["all-reduce"]
    with replacing_collectives() as report:
        got, text = grad(w), compiled(grad, w)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, np.asarray(x).sum(axis=0))  # d/dw of sum(x * w)
    assert xla_collectives(text) == [] and jaxcoll_calls(text) == {"jaxcoll_all_reduce"}
    psum, = report.replaced  # the forward psum's result is not used: only the transposed one is left
    assert (psum.collective, psum.axes, int(np.prod(psum.shape))) == ("psum", ("x", "y"), 4)


# -- options, nesting, restoring ----------------------------------------------------------------------------------

def _psum_and_gather(v):
    return lax.psum(v, "i") + lax.all_gather(v, "i", tiled=True)[:1]


def test_collectives_option_leaves_the_others_to_xla_and_the_report_says_so():
    x = ints((8, 4), "1d8")
    program = jit_spmd(_psum_and_gather, "1d8")
    expected = program(x)
    with replacing_collectives(collectives=["all_gather"]) as report:
        got, text = program(x), compiled(program, x)
    np.testing.assert_array_equal(got, expected)
    assert xla_collectives(text) == ["all-reduce"] and jaxcoll_calls(text) == {"jaxcoll_all_gather"}
    left, = report.left_to_xla
    assert left.collective == "psum" and left.reason == "psum is not in collectives="


def test_algorithm_option_and_the_report_table(capsys):
    x = ints((8, 4), "1d8")
    program = jit_spmd(_psum_and_gather, "1d8")
    with replacing_collectives(algorithm="ring", report=True) as report:
        program(x)
        assert capsys.readouterr().out == ""  # printed when the block ends
    assert {(e.collective, e.algorithm) for e in report.replaced} == {("psum", "ring"), ("all_gather", "ring")}
    printed = capsys.readouterr().out
    assert "jaxcoll.replacing_collectives: 2 collectives replaced, 0 left to XLA" in printed
    assert re.search(r"psum .*test_replace_context\.py:\d+.* jaxcoll\.all_reduce .* ring", printed), printed


def test_nested_blocks_the_innermost_decides_and_each_end_restores_the_outer():
    x = ints((8, 4), "1d8")
    program = jit_spmd(_psum_and_gather, "1d8")
    expected = program(x)
    with replacing_collectives(collectives=["psum"]) as outer:
        outer_text = compiled(program, x)
        with replacing_collectives(collectives=["all_gather"]) as inner:
            inner_text = compiled(program, x)
            np.testing.assert_array_equal(program(x), expected)
        again = compiled(program, x)
    after = compiled(program, x)
    assert xla_collectives(outer_text) == ["all-gather"] and jaxcoll_calls(outer_text) == {"jaxcoll_all_reduce"}
    assert xla_collectives(inner_text) == ["all-reduce"] and jaxcoll_calls(inner_text) == {"jaxcoll_all_gather"}
    assert xla_collectives(again) == ["all-gather"] and jaxcoll_calls(again) == {"jaxcoll_all_reduce"}
    assert xla_collectives(after) == ["all-reduce", "all-gather"] and not jaxcoll_calls(after)
    assert {e.collective for e in outer.replaced} == {"psum"}
    assert {e.collective for e in inner.replaced} == {"all_gather"}


def _rules():
    """Every rule jax holds for the replaced primitives, as it holds them."""
    saved = {name: _jax.LoweringRules(p) for name, p in primitives().items()}
    return {name: (s.default, s.platforms) for name, s in saved.items()}


def test_an_exception_in_the_block_restores_jaxs_rules_exactly():
    x = ints((8, 4), "1d8")
    program = jit_spmd(_psum_and_gather, "1d8")
    rules = _rules()
    assert {"psum", "psum_invariant", "all_gather", "reduce_scatter", "ppermute", "pbroadcast"} <= set(rules)
    with pytest.raises(ZeroDivisionError):
        with replacing_collectives():
            assert _rules() != rules
            program(x)
            1 / 0
    assert _rules() == rules
    text = compiled(program, x)
    assert xla_collectives(text) == ["all-reduce", "all-gather"] and not jaxcoll_calls(text)


def test_transforms_traced_in_the_block_take_its_options():
    x = ints((8, 8), "1d8")
    transformed = replace_collectives(jax.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh("1d8"), in_specs=P("i"),
                                                    out_specs=P("i")))
    with replacing_collectives(algorithm="two_shot"):
        jax.jit(transformed).lower(x)
    assert {e.algorithm for e in transformed.report.replaced} == {"two_shot"}


# -- what jaxcoll cannot run -------------------------------------------------------------------------------------

def test_axis_index_groups_compile_to_jaxcoll_in_the_block():
    x = ints((8, 4), "1d8")
    program = jit_spmd(lambda v: lax.psum(v, "i", axis_index_groups=[[0, 2, 4, 6], [1, 3, 5, 7]]), "1d8",
                       check_vma=False)
    expected = program(x)
    with replacing_collectives(strict=True) as report:
        got, text = program(x), compiled(program, x)
    np.testing.assert_array_equal(got, expected)
    assert xla_collectives(text) == [] and jaxcoll_calls(text) == {"jaxcoll_all_reduce"}
    assert report.replaced and not report.left_to_xla


def test_what_jaxcoll_cannot_run_falls_back_to_xla_with_a_warning_and_a_report_row():
    x = put(np.arange(8 * 4).reshape(8, 4).astype(np.complex64), "1d8")
    program = jit_spmd(lambda v: lax.psum(v, "i"), "1d8")
    expected = program(x)
    with pytest.warns(ReplacementWarning, match=r"lax\.psum .*dtype='complex64'"):
        with replacing_collectives() as report:
            got, text = program(x), compiled(program, x)
    np.testing.assert_array_equal(got, expected)
    assert xla_collectives(text) == ["all-reduce"]
    left, = report.left_to_xla
    assert left.collective == "psum" and "complex64" in left.reason


def test_a_dtype_the_runtime_lacks_falls_back_and_strict_refuses_it_naming_it():
    x = ints((8, 4), "1d8", np.int16)
    program = jit_spmd(_psum_and_gather, "1d8")
    expected = program(x)
    with pytest.warns(ReplacementWarning, match="dtype='int16'"):
        with replacing_collectives() as report:
            got = program(x)
    np.testing.assert_array_equal(got, expected)
    assert {e.collective for e in report.left_to_xla} == {"psum", "all_gather"}
    with pytest.raises(ReplacementError, match=r"replacing_collectives\(strict=True\): lax\.psum .*dtype='int16'"):
        with replacing_collectives(strict=True):
            program(x)
    assert xla_collectives(compiled(program, x)) == ["all-reduce", "all-gather"]  # the error restored the rules


def test_a_collective_jaxcoll_lacks_keeps_jaxs_lowering_with_a_warning():
    x = ints((8, 8), "1d8")
    program = jit_spmd(point_to_point, "1d8")
    with pytest.warns(ReplacementWarning, match="psend.*left to XLA: primitive='psend'"):
        with replacing_collectives() as report:
            with pytest.raises(NotImplementedError, match="psend is currently only implemented on GPU"):
                program.lower(x)  # jax's own rule, which XLA:CPU lacks
    assert report.left_to_xla[0].collective == "psend"
    with pytest.raises(ReplacementError, match="psend.* cannot run on jaxcoll"):
        with replacing_collectives(strict=True):
            program.lower(x)


def test_no_warning_when_everything_is_replaced():
    x = ints((8, 4), "1d8")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplacementWarning)
        with replacing_collectives():
            jit_spmd(_psum_and_gather, "1d8")(x)


def test_a_program_lowered_for_a_platform_jaxcoll_lacks_keeps_xlas_collectives():
    x = ints((8, 4), "1d8")
    program = jit_spmd(lambda v: lax.psum(v, "i"), "1d8")
    with pytest.warns(ReplacementWarning, match="platform='tpu'"):
        with replacing_collectives() as report:
            exported = jax.export.export(program, platforms=["tpu"])(x)  # lowered, not compiled: no TPU needed
    text = exported.mlir_module()
    assert "stablehlo.all_reduce" in text and "@jaxcoll_" not in text
    left, = report.left_to_xla
    assert left.collective == "psum" and left.reason.startswith("platform='tpu'")
