"""jaxcoll.replace_collectives: a program written with jax.lax collectives gives the same values (and gradients)
when its collectives run on jaxcoll, wherever they are in it, and its compiled HLO has jaxcoll's custom calls
where XLA's collectives were.

Every comparison is with the untransformed program run by XLA. Inputs are small integers held in float32, so
sums are exact whatever the reduction order and the comparisons are bitwise (assert_array_equal).
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxcoll
from jaxcoll import algorithms
from jaxcoll.plan import Collective
from jaxcoll.replace import ReplacementError, ReplacementWarning, replace_collectives, replacing_collectives
from replace_cases import (CASES, every_collective, first_rank, gathered_row, ints, jaxcoll_calls, point_to_point,
                           skip_reason, spmd, xla_collectives, xla_reference)
from sharded import MESH_AXES, mesh, put, small_ints


def both(fn, mesh_name, *args, check_vma=True, reference=None, **options):
    """(XLA's result, jaxcoll's result, the report) of jit(shard_map(fn)) on args; XLA runs `reference` instead
    of fn where given (lax.pbroadcast has no CPU lowering in XLA)."""
    program = spmd(fn, mesh_name, check_vma=check_vma)
    transformed = replace_collectives(program, **options)
    expected = jax.jit(spmd(reference or fn, mesh_name, check_vma=check_vma))(*args)
    got = jax.jit(transformed)(*args)
    return expected, got, transformed.report


# -- every collective, one axis and several, 1D and 2D meshes ---------------------------------------------------

@pytest.mark.parametrize("mesh_name,axis_name", MESH_AXES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_collective_gives_lax_results_bitwise(case, mesh_name, axis_name):
    if skip_reason(case, mesh_name, axis_name):
        pytest.skip(skip_reason(case, mesh_name, axis_name))
    x = ints((8, 8, 8), mesh_name)
    fn = CASES[case](axis_name, mesh_name)
    expected, got, report = both(first_rank(fn), mesh_name, x,
                                 reference=first_rank(xla_reference(case, mesh_name, axis_name)))
    np.testing.assert_array_equal(got, expected)
    collectives = [e for e in report.entries if e.collective != "pvary"]
    assert collectives and all(e.replaced for e in collectives), report


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint32, jnp.bfloat16, np.float16])
def test_dtypes_the_runtime_has_give_lax_results(dtype):
    x = ints((8, 4, 4), "2x4", dtype)

    def fn(v):
        return (lax.psum(v, "y"), lax.pmax(v, "x"), lax.all_gather(v, ("x", "y"), tiled=True),
                lax.psum_scatter(v, "y", scatter_dimension=1, tiled=True))
    expected, got, report = both(first_rank(fn), "2x4", x)
    jax.tree.map(np.testing.assert_array_equal, got, expected)
    assert not report.left_to_xla


def test_psum_of_a_tuple_of_arrays_and_of_an_invariant_value():
    x = ints((8, 4), "2x4")

    def fn(v):
        a, b = lax.psum((v, 2 * v), ("x", "y"))
        c = lax.psum(1.0, "y")  # an invariant value: N equal copies summed
        return a + b + c
    expected, got, _ = both(fn, "2x4", x)
    np.testing.assert_array_equal(got, expected)


def test_without_check_vma_too():
    x = ints((8, 4), "2x4")
    fn = lambda v: lax.psum(v, "y") + lax.all_gather(v, "x", tiled=True)[:1] + lax.pmean(v, ("x", "y"))  # noqa
    expected, got, report = both(fn, "2x4", x, check_vma=False)
    np.testing.assert_array_equal(got, expected)
    assert [e.primitive for e in report.entries] == ["psum", "all_gather", "psum"]


# -- the compiled program -----------------------------------------------------------------------------------------

def test_compiled_hlo_has_jaxcoll_calls_and_no_xla_collective():
    x = ints((8, 8, 8), "2x4")
    program = jax.jit(replace_collectives(spmd(every_collective(), "2x4")))
    text = program.lower(x).compile().as_text()
    assert xla_collectives(text) == []
    assert jaxcoll_calls(text) == {"jaxcoll_all_reduce", "jaxcoll_all_gather", "jaxcoll_reduce_scatter",
                                   "jaxcoll_all_to_all", "jaxcoll_ppermute", "jaxcoll_broadcast"}
    got = program(x)
    np.testing.assert_array_equal(got, jax.jit(spmd(every_collective(gathered_row), "2x4"))(x))


def test_untransformed_program_has_xla_collectives():
    # The check above can fail: the same kind of program compiles to XLA's collectives without the transform.
    text = jax.jit(spmd(lambda v: lax.psum(v, "y"), "2x4")).lower(ints((8, 4), "2x4")).compile().as_text()
    assert xla_collectives(text) == ["all-reduce"] and not jaxcoll_calls(text)


# -- wherever the collectives are ---------------------------------------------------------------------------------

@jax.custom_jvp
def _custom_jvp_psum(v):
    return lax.psum(v, "y")


@_custom_jvp_psum.defjvp
def _custom_jvp_psum_jvp(primals, tangents):
    return _custom_jvp_psum(primals[0]), lax.psum(tangents[0], "y") * 1.0


@jax.custom_vjp
def _custom_vjp_gather(v):
    return lax.all_gather(v, "x", tiled=True)


def _custom_vjp_gather_fwd(v):
    return _custom_vjp_gather(v), None


def _custom_vjp_gather_bwd(_, g):
    return (lax.psum_scatter(g, "x", tiled=True),)


_custom_vjp_gather.defvjp(_custom_vjp_gather_fwd, _custom_vjp_gather_bwd)


def _nested_shard_map(v):
    inner = jax.shard_map(lambda w: lax.psum(w, "y"), mesh=jax.sharding.get_abstract_mesh(),
                          in_specs=P("y"), out_specs=P(), axis_names={"y"})
    return lax.all_gather(inner(v), "x", tiled=True)[:v.shape[0]]


PLACES = {
    "scan": lambda v: lax.scan(lambda c, z: (c + lax.psum(z, "y"), lax.pmax(z, "x")), v, jnp.stack([v, 2 * v]))[0],
    "fori_loop": lambda v: lax.fori_loop(0, 3, lambda i, c: lax.ppermute(c, "x", [(0, 1), (1, 0)]) + c, v),
    "while_loop": lambda v: lax.while_loop(lambda s: lax.psum(s[0], "y") < 6, lambda s: (s[0] + 1, lax.pcast(
        lax.pmean(s[1], "x"), "x", to="varying")), (jnp.zeros((), jnp.int32), v))[1],
    "cond": lambda v: lax.cond(lax.psum(v.sum(), ("x", "y")) > 0,
                               lambda w: lax.all_to_all(w, "y", 1, 1, tiled=True),
                               lambda w: lax.psum_scatter(lax.all_gather(w, "y", axis=1, tiled=True), "y",
                                                          scatter_dimension=1, tiled=True), v),
    "switch": lambda v: lax.switch(2, [lambda w: w, lambda w: 2 * w,
                                       lambda w: lax.pcast(lax.pmin(w, "x"), "x", to="varying")], v),
    "checkpoint": lambda v: jax.checkpoint(lambda w: jnp.sin(lax.psum(w, ("x", "y"))))(v),
    "nested_jit": lambda v: jax.jit(lambda w: lax.all_gather(w, "y", axis=1, tiled=True))(v)[:, :v.shape[1]],
    "custom_jvp": _custom_jvp_psum,
    "custom_vjp": lambda v: _custom_vjp_gather(v)[:v.shape[0]],
    "nested_shard_map": _nested_shard_map,
    "jit_inside_scan_inside_cond": lambda v: lax.cond(True, lambda w: lax.scan(
        lambda c, _: (jax.jit(lambda u: lax.psum(u, "x"))(c) - c, None), w, None, length=2)[0], lambda w: w, v),
}


@pytest.mark.parametrize("place", sorted(PLACES))
def test_collectives_are_replaced_wherever_they_are(place):
    x = ints((8, 8), "2x4")
    if place == "nested_shard_map":  # the outer shard_map leaves "y" to the inner one
        # Automatic axes (jax 0.12 refuses an inner shard_map over an Explicit axis its operand is not split
        # over), and the input laid out as the outer shard_map takes it: no resharding collective from XLA.
        auto = jax.make_mesh((2, 4), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        x = jax.device_put(x, NamedSharding(auto, P("x")))
        program = jax.shard_map(PLACES[place], mesh=auto, in_specs=P("x"), out_specs=P("x"), axis_names={"x"})
    else:
        program = spmd(PLACES[place], "2x4")
    transformed = replace_collectives(program)
    compiled = jax.jit(transformed).lower(x).compile()
    np.testing.assert_array_equal(compiled(x), jax.jit(program)(x))
    assert xla_collectives(compiled.as_text()) == []
    assert transformed.report.entries and not transformed.report.left_to_xla, transformed.report


def test_the_report_says_where_each_collective_was():
    transformed = replace_collectives(spmd(PLACES["jit_inside_scan_inside_cond"], "2x4"))
    jax.jit(transformed).lower(ints((8, 8), "2x4"))
    places = {e.where for e in transformed.report.entries if e.collective == "psum"}
    assert places == {"shard_map/cond[1]/scan/jit(<lambda>)"}


# -- gradients ----------------------------------------------------------------------------------------------------

def _model(v):
    """A little of everything differentiable: tensor-parallel matmuls, a scan, a checkpoint, custom rules."""
    w = lax.all_gather(v, "y", axis=1, tiled=True)          # [1, 8 * 4] on each rank
    h = jnp.tanh(w @ jnp.ones((w.shape[1], 4)) / 8)
    h = lax.psum_scatter(jnp.tile(h, (1, 8)), "y", scatter_dimension=1, tiled=True)  # [1, 8]
    h, _ = lax.scan(lambda c, _: (jnp.sin(lax.pmean(c, "x")) + c, None), h, None, length=2)
    h = jax.checkpoint(lambda u: lax.ppermute(u, "x", [(0, 1), (1, 0)]) * u)(h)
    h = h + _custom_jvp_psum(v) + _custom_vjp_gather(v)[:1] + lax.all_to_all(v, "y", 1, 1, tiled=True)
    return lax.psum((h ** 2).sum(), ("x", "y"))


def test_grad_equals_the_grad_of_the_lax_program_and_runs_on_jaxcoll():
    x = put(np.random.default_rng(1).normal(size=(8, 8)).astype(np.float32), "2x4")
    spec = P(("x", "y"))
    grad = lambda f: jax.jit(jax.grad(lambda v: jax.shard_map(  # noqa: E731
        f, mesh=mesh("2x4"), in_specs=spec, out_specs=P())(v)))
    expected = grad(_model)(x)
    transformed = grad(replace_collectives(_model))
    compiled = transformed.lower(x).compile()
    # Same operations, but jaxcoll's sums and XLA's associate differently: a few ulps.
    np.testing.assert_allclose(compiled(x), expected, rtol=2e-6, atol=1e-6)
    text = compiled.as_text()
    assert xla_collectives(text) == []
    assert {"jaxcoll_all_reduce", "jaxcoll_reduce_scatter", "jaxcoll_all_gather"} <= jaxcoll_calls(text)


def test_grad_over_the_transformed_shard_map_uses_jaxcoll_for_pvary_transposes():
    # pvary (an invariant value made varying) transposes to psum in the backward pass.
    x = ints((8, 4), "2x4")
    program = jax.shard_map(lambda v, w: (v * w).sum(1), mesh=mesh("2x4"), in_specs=(P(("x", "y")), P()),
                            out_specs=P(("x", "y")))
    loss = lambda f: lambda w: f(x, w).sum()  # noqa: E731
    w = jnp.arange(4.0)
    expected = jax.jit(jax.grad(loss(program)))(w)
    compiled = jax.jit(jax.grad(loss(replace_collectives(program)))).lower(w).compile()
    np.testing.assert_array_equal(compiled(w), expected)
    assert xla_collectives(compiled.as_text()) == []


def test_differentiating_inside_the_transformed_function():
    x = put(np.random.default_rng(2).normal(size=(8, 8)).astype(np.float32), "2x4")
    fn = lambda v: jax.grad(lambda u: lax.psum((lax.all_gather(u, "y", tiled=True) ** 2).sum(), "x"))(v)  # noqa
    expected, got, report = both(fn, "2x4", x)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert {e.collective for e in report.replaced} >= {"all_gather", "psum_scatter", "psum"}


# -- vmap ---------------------------------------------------------------------------------------------------------

def test_vmap_of_the_transformed_program():
    m = mesh("2x4")
    x = jax.device_put(small_ints(np.random.default_rng(3), (3, 8, 8), np.float32), NamedSharding(m, P(None, "y")))
    program = jax.shard_map(lambda v: (lax.psum(v, "y"), lax.all_gather(v, "y", axis=1, tiled=True)), mesh=m,
                            in_specs=P("y"), out_specs=(P(), P("y")))
    transformed = jax.jit(jax.vmap(replace_collectives(program)))
    jax.tree.map(np.testing.assert_array_equal, transformed(x), jax.jit(jax.vmap(program))(x))
    assert xla_collectives(transformed.lower(x).compile().as_text()) == []


def test_vmap_inside_the_shard_map_body():
    x = ints((8, 3, 4), "2x4")
    fn = lambda v: jax.vmap(lambda r: lax.psum(r, "y") + lax.ppermute(r, "x", [(0, 1), (1, 0)]), 1, 1)(v)  # noqa
    expected, got, _ = both(fn, "2x4", x)
    np.testing.assert_array_equal(got, expected)


# -- the ways in --------------------------------------------------------------------------------------------------

def test_decorator_with_and_without_arguments_over_and_under_jit():
    x = ints((8, 4), "1d8")
    m = mesh("1d8")
    body = lambda v: lax.psum(v, "i") + lax.all_gather(v, "i", tiled=True)[:1]  # noqa: E731
    expected = jax.jit(jax.shard_map(body, mesh=m, in_specs=P("i"), out_specs=P("i")))(x)

    @jax.jit
    @replace_collectives
    @jax.shard_map(mesh=m, in_specs=P("i"), out_specs=P("i"))
    def under(v):
        return body(v)

    @replace_collectives(algorithm="ring")
    @jax.jit
    @jax.shard_map(mesh=m, in_specs=P("i"), out_specs=P("i"))
    def over(v):
        return body(v)

    @jax.jit
    @jax.shard_map(mesh=m, in_specs=P("i"), out_specs=P("i"))
    @replace_collectives
    def inside(v):
        return body(v)

    for f in (under, over, inside):
        np.testing.assert_array_equal(f(x), expected)
    np.testing.assert_array_equal(over(x), expected)  # a second eager call of the transformed jit
    assert {e.algorithm for e in over.report.replaced if e.collective != "pvary"} == {"ring"}
    assert xla_collectives(under.lower(x).compile().as_text()) == []
    assert xla_collectives(inside.lower(x).compile().as_text()) == []


def test_pytrees_and_static_arguments_pass_through():
    x = ints((8, 4), "1d8")

    def f(tree, scale, name):
        assert name == "sum" and scale == 2
        return {"out": lax.psum(tree["a"] * scale, "i"), "n": name}

    program = jax.shard_map(lambda t: f({"a": t}, 2, "sum")["out"], mesh=mesh("1d8"), in_specs=P("i"), out_specs=P("i"))
    out = jax.jit(jax.shard_map(lambda t: replace_collectives(f)({"a": t}, 2, "sum")["out"], mesh=mesh("1d8"),
                                in_specs=P("i"), out_specs=P("i")))(x)
    np.testing.assert_array_equal(out, jax.jit(program)(x))


# -- options ------------------------------------------------------------------------------------------------------

def test_collectives_option_leaves_the_others_to_xla_and_the_report_says_so():
    x = ints((8, 8), "2x4")
    fn = lambda v: lax.psum(v, "y") + lax.all_gather(v, "x", axis=1, tiled=True)[:, :8]  # noqa: E731
    program = spmd(fn, "2x4")
    transformed = replace_collectives(program, collectives=["pmean"])  # pmean is psum
    compiled = jax.jit(transformed).lower(x).compile()
    np.testing.assert_array_equal(compiled(x), jax.jit(program)(x))
    assert xla_collectives(compiled.as_text()) == ["all-gather"]
    assert "jaxcoll_all_reduce" in jaxcoll_calls(compiled.as_text())
    left, = transformed.report.left_to_xla
    assert left.collective == "all_gather" and "not in collectives=" in left.reason


def test_algorithm_option_by_name_and_per_collective():
    x = ints((8, 8), "1d8")
    fn = lambda v: lax.psum(v, "i") + lax.all_to_all(v, "i", 1, 1, tiled=True)  # noqa: E731
    _, _, report = both(fn, "1d8", x, algorithm="ring")
    # all_to_all has no ring: it runs "auto".
    assert {(e.collective, e.algorithm) for e in report.replaced} >= {("psum", "ring"), ("all_to_all", "auto")}
    plan = algorithms.select(Collective.ALL_REDUCE, 8, 64 * 4, np.dtype(np.float32), "two_shot")
    expected, got, report = both(fn, "1d8", x, algorithm={"psum": plan, "all_to_all": "direct"})
    np.testing.assert_array_equal(got, expected)
    assert {(e.collective, e.algorithm) for e in report.replaced} >= {("psum", plan.name or "plan"),
                                                                     ("all_to_all", "direct")}


def test_context_sets_the_options_of_transforms_traced_inside_it():
    x = ints((8, 8), "1d8")
    transformed = replace_collectives(spmd(lambda v: lax.psum(v, "i"), "1d8"))
    with replacing_collectives(algorithm="two_shot", collectives=("psum",)):
        jax.jit(transformed).lower(x)
    assert {e.algorithm for e in transformed.report.replaced} == {"two_shot"}
    explicit = replace_collectives(spmd(lambda v: lax.psum(v, "i"), "1d8"), algorithm="ring")
    with replacing_collectives(algorithm="two_shot"):
        jax.jit(explicit).lower(x)
    assert {e.algorithm for e in explicit.report.replaced} == {"ring"}


@pytest.mark.parametrize("kwargs,message", [
    (dict(collectives=["psum", "pgather"]), "collectives names 'pgather'"),
    (dict(algorithm="fastest"), "algorithm='fastest' is not an algorithm of any collective"),
    (dict(algorithm={"ppermute": "ring"}), "algorithm['ppermute']='ring' is not known for ppermute"),
    (dict(algorithm={"all_gather": algorithms.builtin(Collective.ALL_REDUCE, "ring", 4)}),
     "algorithm['all_gather'] is a all_reduce plan"),
    (dict(strict="yes"), "strict='yes' must be True or False"),
])
def test_bad_options_fail_when_the_transform_is_made_naming_them(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        replace_collectives(lambda v: v, **kwargs)
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        with replacing_collectives(**kwargs):
            pass


# -- the report ---------------------------------------------------------------------------------------------------

def test_report_lists_what_was_replaced_and_what_was_left_and_prints_as_a_table(capsys):
    x = ints((8, 8), "2x4")
    fn = lambda v: lax.pmean(v, "y") + lax.ppermute(v, "x", [(0, 1), (1, 0)])  # noqa: E731
    _, _, report = both(fn, "2x4", x, collectives=["psum"], report=True)
    printed = capsys.readouterr().out
    rows = [(e.collective, e.axes, e.replaced) for e in report.entries if e.collective != "pvary"]
    assert rows == [("psum", ("y",), True), ("ppermute", ("x",), False)]
    psum, = [e for e in report.replaced if e.collective == "psum"]
    assert (psum.primitive, psum.jaxcoll, psum.algorithm, psum.shape, psum.dtype) == (
        "psum_invariant", "jaxcoll.all_reduce", "auto", (1, 8), "float32")
    text = str(report)
    assert text in printed
    for word in ("collective", "runs on", "psum", "jaxcoll.all_reduce", "ppermute", "XLA", "not in collectives="):
        assert word in text
    assert "replaced" in text and "left to XLA" in text


# -- strict, and falling back to XLA ------------------------------------------------------------------------------

def test_axis_index_groups_run_on_jaxcoll():
    x = ints((8, 4), "1d8")
    expected, got, report = both(lambda v: lax.psum(v, "i", axis_index_groups=[[0, 2, 4, 6], [1, 3, 5, 7]]), "1d8",
                                 x, check_vma=False, strict=True)
    np.testing.assert_array_equal(got, expected)
    assert report.replaced and not report.left_to_xla


def test_groups_that_do_not_split_the_axis_are_an_error_even_when_not_strict():
    x = ints((8, 4), "1d8")
    fn = spmd(lambda v: lax.psum(v, "i", axis_index_groups=[[0, 1], [2, 3]]), "1d8", check_vma=False)
    with pytest.raises(ValueError, match=r"lax\.psum: axis_index_groups=\(\(0, 1\), \(2, 3\)\) does not cover"):
        jax.jit(replace_collectives(fn)).trace(x)


def test_a_dtype_the_runtime_lacks_falls_back_or_is_refused_when_strict():
    x = ints((8, 4), "1d8", np.int16)
    fn = lambda v: lax.psum(v, "i") + lax.all_gather(v, "i", tiled=True)[:1]  # noqa: E731
    with pytest.warns(ReplacementWarning, match="dtype='int16'"):
        expected, got, report = both(fn, "1d8", x)
    np.testing.assert_array_equal(got, expected)
    assert {e.collective for e in report.left_to_xla} >= {"psum", "all_gather"}
    with pytest.raises(ReplacementError, match=r"lax\.psum .*dtype='int16'"):
        jax.jit(replace_collectives(spmd(fn, "1d8"), strict=True))(x)


def test_a_plan_that_does_not_fit_the_call_falls_back_naming_it():
    x = ints((8, 4), "1d8")
    plan = algorithms.builtin(Collective.ALL_REDUCE, "ring", 4)
    with pytest.warns(ReplacementWarning, match="algorithm=.*nranks=4"):
        expected, got, _ = both(lambda v: lax.psum(v, "i"), "1d8", x, algorithm={"psum": plan})
    np.testing.assert_array_equal(got, expected)


def test_no_warning_when_everything_is_replaced():
    x = ints((8, 4), "1d8")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplacementWarning)
        both(lambda v: lax.psum(v, "i"), "1d8", x)


# -- jaxcoll's own collectives inside a shard_map with automatic axes ---------------------------------------------

def test_jaxcoll_collective_inside_a_shard_map_that_leaves_axes_automatic():
    # Was a TypeError from jax's axis_index lowering (jaxcoll passed it a context with the collective's operand).
    m = mesh("2x4")
    x = ints((8, 8), "2x4")
    program = lambda f: jax.jit(jax.shard_map(f, mesh=m, in_specs=P("x"), out_specs=P(), axis_names={"x"}))  # noqa
    np.testing.assert_array_equal(program(lambda v: jaxcoll.all_reduce(v, "x"))(x),
                                  program(lambda v: lax.psum(v, "x"))(x))


def test_a_collective_jaxcoll_lacks_runs_on_xla_with_a_warning_or_is_refused_when_strict():
    x = ints((8, 8), "1d8")
    transformed = replace_collectives(spmd(point_to_point, "1d8"))
    with pytest.warns(ReplacementWarning, match="left to XLA: primitive='p(send|recv)'"):
        jax.jit(transformed).trace(x)
    assert [e.collective for e in transformed.report.left_to_xla] == ["psend", "precv"]
    assert "point-to-point" in transformed.report.left_to_xla[0].reason
    with pytest.raises(ReplacementError, match="psend.* cannot run on jaxcoll"):
        jax.jit(replace_collectives(spmd(point_to_point, "1d8"), strict=True)).trace(x)


def _equation(closed, name):
    """The first equation of primitive `name` in `closed`, searching inside shard_maps and jits."""
    for eqn in closed.jaxpr.eqns:
        if eqn.primitive.name == name:
            return eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found = _equation(jax.extend.core.ClosedJaxpr(sub, ()), name)
            if found is not None:
                return found
    return None


def test_a_construct_without_collectives_is_bound_as_it_was(monkeypatch):
    from jaxcoll.replace import interpreter
    retraced = []
    monkeypatch.setattr(interpreter, "_retrace", lambda session, closed, where: retraced.append(where))
    body = lambda v: lax.scan(lambda c, _: (jnp.sin(c), None), v, None, length=2)[0]  # noqa: E731
    program = spmd(lambda v: lax.psum(body(v), "i"), "1d8")
    x = ints((8, 4), "1d8")
    np.testing.assert_array_equal(jax.jit(replace_collectives(program))(x), jax.jit(program)(x))
    assert retraced == []


def test_a_transformed_jit_called_again_reuses_its_transformed_program():
    # The same jaxpr object is what lets jit reuse its compiled executable between eager calls.
    program = replace_collectives(jax.jit(spmd(lambda v: lax.psum(v, "i"), "1d8")))
    x = ints((8, 4), "1d8")
    first, second = (_equation(jax.make_jaxpr(program)(x), "jit") for _ in range(2))
    assert first.params["jaxpr"] is second.params["jaxpr"]
    assert _equation(first.params["jaxpr"], "jaxcoll_all_reduce") is not None


def test_a_collective_over_a_vmap_axis_and_a_mesh_axis_falls_back_to_xla():
    x = ints((8, 3, 4), "1d8")
    inner = lambda r: lax.psum(r, ("b", "i"))  # noqa: E731
    # (lax.psum refuses these axes under check_vma: the vmap axis is not in the value's type)
    expected = jax.jit(spmd(lambda v: jax.vmap(inner, axis_name="b")(v), "1d8", check_vma=False))(x)
    with pytest.warns(ReplacementWarning, match="mixes vmap axes with mesh axes"):
        got = jax.jit(spmd(lambda v: jax.vmap(replace_collectives(inner), axis_name="b")(v), "1d8",
                           check_vma=False))(x)
    np.testing.assert_array_equal(got, expected)


def test_called_eagerly_without_jit():
    x = ints((8, 4), "2x4")
    program = spmd(lambda v: lax.psum(v, "y") + lax.all_gather(v, "x", tiled=True)[:1], "2x4")
    np.testing.assert_array_equal(replace_collectives(program)(x), jax.jit(program)(x))
