"""jaxcoll's contact with JAX's versions: the supported range, and every use of private JAX in jaxcoll, each
with the public API it stands in for (or the lack of one) and the versions it was checked on.

No other module imports `jax._src` (tests/test_private_jax.py holds them to it): when a JAX release moves
something private, this file is the one to change.
"""

from __future__ import annotations

import re

# The supported JAX releases: from JAX_OLDEST up to, not including, JAX_BELOW. pyproject.toml states the same
# range in its dependencies (tests/test_jax_versions.py holds them equal). 0.10.2 is the newest JAX for Python
# 3.11; 0.11.x and 0.12.x need Python >= 3.12.
JAX_OLDEST = (0, 10, 2)
JAX_BELOW = (0, 13)
SUPPORTED_JAX = f">={'.'.join(map(str, JAX_OLDEST))},<{'.'.join(map(str, JAX_BELOW))}"


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string: "0.12.0.1" -> (0, 12, 0, 1), "0.13.0.dev20260101" -> (0, 13, 0)."""
    numbers = []
    for part in version.split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        numbers.append(int(match.group()))
        if match.end() != len(part):
            break
    return tuple(numbers)


def check_version(version: str | None = None) -> None:
    """ImportError naming the installed JAX and the supported range unless `version` (default: the installed
    jax.__version__) is in the range."""
    if version is None:
        import jax
        version = jax.__version__
    if not JAX_OLDEST <= release(version) < JAX_BELOW:
        raise ImportError(
            f"jaxcoll supports jax{SUPPORTED_JAX}, but jax {version} is installed. Install a supported JAX "
            f"(python -m pip install 'jax{SUPPORTED_JAX}'), then rebuild jaxcoll against its jaxlib.")


def distributed_client():
    """jax.distributed's key-value client, or None before jax.distributed.initialize(). No public API exposes
    it (jax.distributed has initialize/shutdown only). Checked on jax 0.10.2, 0.11.2 and 0.12.0.1."""
    from jax._src import distributed
    return distributed.global_state.client


def coordinator_address() -> str | None:
    """The address jax.distributed.initialize was given for the coordinator (None before it). No public API
    exposes it. Checked on jax 0.10.2, 0.11.2 and 0.12.0.1."""
    from jax._src import distributed
    return distributed.global_state.coordinator_address


# -- Typing under shard_map -------------------------------------------------------------------------------------
# Each function below was checked on jax 0.10.2, 0.11.2 and 0.12.0.1.

def check_vma() -> bool:
    """Whether values carry varying/invariant types here: inside shard_map(check_vma=True). Public:
    `jax.config.check_vma` reads the same (thread-local) setting that shard_map sets while it traces."""
    import jax
    return bool(jax.config.check_vma)


def varying_axes(aval) -> frozenset:
    """The mesh axes an abstract value varies over (empty for a value without manual-axis typing). No public
    API: jax.typeof(x) gives the aval, whose `mat` (ManualAxisType; `vma` before jax 0.10) holds them."""
    mat = getattr(aval, "mat", None)
    return frozenset(mat.varying) if mat is not None else frozenset()


def invariant_over(aval, axes):
    """`aval` typed invariant over `axes`: the result type of a reduction over them (lax.psum's abstract eval
    does the same). No public API."""
    return aval.update(manual_axis_type=aval.mat.update(
        varying=frozenset(a for a in aval.mat.varying if a not in axes)))


def varying_over(aval, axes):
    """`aval` typed varying over `axes` as well: the result type of a pvary (lax's pvary abstract eval does the
    same, and places the result on the current abstract mesh). No public API."""
    from jax.sharding import get_abstract_mesh
    return aval.update(sharding=aval.sharding.update(mesh=get_abstract_mesh()),
                       manual_axis_type=aval.mat.update(varying=aval.mat.varying | frozenset(axes)))


def unreduced_axes(aval) -> frozenset:
    """The mesh axes over which `aval` is unreduced: each device holds a partial sum, and the value is the sum of
    the pieces (jax >= 0.10; empty without manual-axis typing). No public API: the aval's `mat` holds them."""
    mat = getattr(aval, "mat", None)
    return frozenset(getattr(mat, "unreduced", ())) if mat is not None else frozenset()


def reduced_axes(aval) -> frozenset:
    """The mesh axes over which `aval` is reduced (the same value on every device, whose cotangent is
    unreduced). No public API, as for unreduced_axes."""
    mat = getattr(aval, "mat", None)
    return frozenset(getattr(mat, "reduced", ())) if mat is not None else frozenset()


def lax_abstract_eval(name: str, aval, **params):
    """(result type, effects) of jax.lax's collective primitive `name` on `aval`: jaxcoll's counterparts of jax's
    reduced/unreduced collectives type their results with jax's own rule, so they type them as jax does. Public:
    none (those primitives are not exported; Primitive.abstract_eval is the rule def_effectful_abstract_eval
    registered)."""
    return lax_collective_primitives()[name].abstract_eval(aval, **params)


def preduced(x, axes: tuple):
    """jax.lax's invariant -> reduced cast (no data moves): the transpose of a psum of unreduced values. Public:
    none (jax._src.lax.parallel.preduced; jax.lax does not export it)."""
    from jax._src.lax import parallel
    return parallel.preduced(x, axes)


def result_like(like, shape: tuple, dtype):
    """The declared type of a jax.ffi.ffi_call result of `shape` and `dtype` that varies over the mesh axes `like`
    varies over (under shard_map(check_vma=True) ffi_call types its results from the declared ones). Public API:
    jax.ShapeDtypeStruct, whose argument for those axes changed name (vma, then manual_axis_type at 0.10);
    updating jax.typeof(like) keeps them on every version. `shape` has like's rank (the aval's sharding names one
    entry per dimension)."""
    import jax
    import numpy as np
    return jax.typeof(like).update(shape=tuple(shape), dtype=np.dtype(dtype))


# -- Primitives and their rules ---------------------------------------------------------------------------------
# jaxcoll's primitives are built from jax.extend.core.Primitive, and their lowering rules emit IR through
# jax.extend.mlir (ir, dialects.stablehlo). What else they need is here: JAX's API compatibility policy counts
# jax.interpreters (ad, batching, mlir) and jax.core as legacy modules of private APIs, scheduled for deprecation,
# like jax._src; jax.extend has no registration of rules nor these IR helpers. Each function names what it stands
# in for. In use from jax.interpreters on jax 0.10.2, 0.11.2 and 0.12.0.1 before they moved here.

def register_lowering(primitive, rule, *, platform: str | None = None, cacheable: bool = True) -> None:
    """Register `rule` as `primitive`'s lowering (for `platform` only, if given). Public: none (jax.extend.mlir
    has no registration); stands in for jax.interpreters.mlir.register_lowering."""
    from jax.interpreters import mlir
    mlir.register_lowering(primitive, rule, platform=platform, cacheable=cacheable)


def register_jvp(primitive, rule) -> None:
    """Register `primitive`'s JVP rule. Public: none (jax.custom_jvp is for functions, not primitives); stands in
    for jax.interpreters.ad.primitive_jvps."""
    from jax.interpreters import ad
    ad.primitive_jvps[primitive] = rule


def register_transpose(primitive, rule) -> None:
    """Register `primitive`'s transpose rule (ad.primitive_transposes' form). Public: none (jax.custom_vjp is for
    functions); stands in for jax.interpreters.ad.primitive_transposes."""
    from jax.interpreters import ad
    ad.primitive_transposes[primitive] = rule


def register_linear(primitive, transpose_rule) -> None:
    """Register `primitive` as linear: its JVP applies it to the tangents, and `transpose_rule(cotangent, *primals,
    **params)` transposes it. Public: none; stands in for jax.interpreters.ad.deflinear2."""
    from jax.interpreters import ad
    ad.deflinear2(primitive, transpose_rule)


def register_batching(primitive, rule, *, axis_data: bool = True) -> None:
    """Register `primitive`'s batching (vmap) rule: `rule(axis_data, vals_in, dims_in, **params)`, which is told
    the vmapped axis (its name and size), or with axis_data=False `rule(vals_in, dims_in, **params)`. Public: none
    (jax.custom_batching is for functions); stands in for jax.interpreters.batching.fancy_primitive_batchers and
    batching.primitive_batchers."""
    from jax.interpreters import batching
    (batching.fancy_primitive_batchers if axis_data else batching.primitive_batchers)[primitive] = rule


def batching_rule(primitive):
    """The batching rule registered for `primitive` (of the form register_batching takes with axis_data=True): a
    jax.lax primitive's, to batch as it does. Public: none; reads jax.interpreters.batching.fancy_primitive_batchers."""
    from jax.interpreters import batching
    return batching.fancy_primitive_batchers[primitive]

def axis_env():
    """The named axes bound by enclosing shard_map/vmap at trace time (`axis_exists`, `axis_size`). No public API
    asks whether a name is bound without tracing something that raises when it is not."""
    from jax._src import core
    return core.get_axis_env()


def named_axis_effect(axis_name):
    """The effect a collective over `axis_name` declares, as jax.lax's do, so that jax keeps it out of
    transformations that would need the axis unbound. No public API."""
    from jax._src import core
    return core.NamedAxisEffect(axis_name)


def linear_jvp(primitive, primals, tangents, **params):
    """The JVP of a linear primitive (the primitive applied to the tangents). No public API;
    `jax.interpreters.ad.deflinear2` registers it together with a transpose, which op-dependent rules cannot
    use."""
    from jax._src.interpreters import ad
    return ad.linear_jvp(primitive, primals, tangents, **params)


def linear_transpose2(transpose_rule, cotangent, *primals, **params):
    """Adapts a transpose rule of the deflinear2 form to `ad.primitive_transposes` (with the ad.Zero
    cotangent handled). No public API."""
    from jax._src.interpreters import ad
    return ad.linear_transpose2(transpose_rule, cotangent, *primals, **params)


def pbroadcast_p():
    """jax.lax's pbroadcast primitive, whose batching rule computes a broadcast over a vmapped axis. Public:
    none (jax.extend.core.primitives has ppermute_p and all_to_all_p, not pbroadcast_p)."""
    from jax._src.lax import parallel
    return parallel.pbroadcast_p


# -- Lowering ---------------------------------------------------------------------------------------------------

def ir_constant(value):
    """A constant of the lowered program holding the numpy value `value`. Public: none (jax.extend.mlir.ir builds
    attributes, not JAX's dense constants); stands in for jax.interpreters.mlir.ir_constant."""
    from jax.interpreters import mlir
    return mlir.ir_constant(value)


def ir_attribute(value):
    """An MLIR attribute holding a Python or numpy value (a custom call's backend_config entry). Public: none for
    numpy arrays and scalars; stands in for jax.interpreters.mlir.ir_attribute."""
    from jax.interpreters import mlir
    return mlir.ir_attribute(value)


def aval_to_ir_type(module_context, aval):
    """The MLIR type of abstract value `aval` in the module being lowered. Public: none; stands in for
    jax.interpreters.mlir.aval_to_ir_type."""
    from jax.interpreters import mlir
    return mlir.aval_to_ir_type(module_context, aval)


def lower_fun(fun, multiple_results: bool):
    """A lowering rule that traces `fun` (a function of JAX values) and inlines its lowering. Public: none (the
    documented way to lower a primitive in terms of others, from JAX's custom-primitive tutorial); stands in for
    jax.interpreters.mlir.lower_fun."""
    from jax.interpreters import mlir
    return mlir.lower_fun(fun, multiple_results=multiple_results)


def axis_index_hlo(ctx, axis_name):
    """This device's index along mesh axis `axis_name`, as an s32 value of the lowered program. What
    jax.lax.axis_index lowers to; no public API emits it inside another primitive's lowering rule (a rule could
    call mlir.lower_fun(lax.axis_index), at the cost of a nested function per call)."""
    import numpy as np
    from jax._src import core
    from jax._src.lax import parallel
    # Inside a shard_map that leaves some mesh axes automatic, the rule lowers lax.axis_index as a function of
    # the rule context's operands (mlir.lower_fun): axis_index has none, the collective calling it does. Give it
    # the context of an axis_index (no operands, one s32 result). Checked on jax 0.10.2.
    index_ctx = ctx.replace(avals_in=(), avals_out=(core.ShapedArray((), np.dtype(np.int32)),))
    return parallel._build_axis_index_lowering_hlo(index_ctx, axis_name, ctx.module_context.axis_context)


def custom_call(*args, **kwargs):
    """An stablehlo.custom_call with a backend_config dictionary of attributes, api_version 4 (typed FFI).
    Public: jax.ffi.ffi_lowering builds the same op, but only as a whole lowering rule and without operand
    layouts chosen per call; jaxcoll emits the call among other ops of its rule."""
    from jax._src.interpreters import mlir
    return mlir.custom_call(*args, **kwargs)


def convert_hlo(ctx, value, aval_in, aval_out):
    """Element type conversion in a lowering rule. No public API (jax.interpreters.mlir does not export it)."""
    from jax._src.interpreters import mlir
    return mlir.convert_hlo(ctx, value, aval_in, aval_out)


def reshape_hlo(ctx, value, aval_out):
    """A reshape in a lowering rule (static or dynamic shapes). No public API."""
    from jax._src.interpreters import mlir
    return mlir.reshape(ctx, value, aval_out)


def full_like_aval(ctx, value, aval):
    """A constant of `aval`'s shape filled with `value`, in a lowering rule. No public API."""
    from jax._src.interpreters import mlir
    return mlir.full_like_aval(ctx, value, aval)


# -- FFI registration -------------------------------------------------------------------------------------------

def register_ffi_type(name: str, type_capsules, platform: str = "cpu") -> None:
    """Register an FFI state type. Public: jax.ffi.register_ffi_type. But before the CPU backend exists jaxlib
    defers it and replays deferred registrations in the wrong order when the backend starts (FFI targets before
    FFI types, which XLA rejects); then the type goes straight into XLA's process-wide registry
    (jaxlib.xla_client._xla.register_custom_type). Checked on jaxlib 0.10.2, 0.11.2 and 0.12.0.1."""
    import jax.ffi
    from jaxlib import xla_client
    deferred = platform not in getattr(xla_client, "_custom_type_id_handler", {platform: None})
    direct = getattr(getattr(xla_client, "_xla", None), "register_custom_type", None)
    if deferred and direct is not None:
        direct(name, type_capsules)
    else:
        jax.ffi.register_ffi_type(name, type_capsules, platform=platform)


# -- Replacing jax.lax's lowering rules (replacing_collectives) ------------------------------------------------

def lax_collective_primitives() -> dict:
    """jax.lax's collective primitives by their jaxpr name, among them those jax.lax does not export:
    psum_invariant (lax.psum under check_vma), all_gather_invariant (all_gather(to="invarying")), reduce_scatter
    (lax.psum_scatter), pbroadcast, and those jaxcoll has no counterpart for (psend, precv, the unreduced forms,
    the start/done pairs). Public: jax.lax exports psum_p, pmax_p, pmin_p, all_gather_p, all_to_all_p,
    ppermute_p and ragged_all_to_all_p only; the rest are read from jax's module of collectives. Checked on jax
    0.10.2 and 0.12.0.1."""
    from jax._src import core
    from jax._src.lax import parallel
    return {p.name: p for p in vars(parallel).values() if isinstance(p, core.Primitive)}


class LoweringRules:
    """What jax holds for one primitive's lowering: its default rule, its platform-specific rules and whether it
    is lowered uncached, as `saved` found them. Public: none; register_lowering (above) adds or replaces a rule,
    but nothing reads a registered rule back or removes one; a block that replaces rules for a while must
    do both to leave jax as it was. Checked on jax 0.10.2 and 0.12.0.1 (mlir._lowerings,
    _platform_specific_lowerings, _uncacheable_primitives)."""

    def __init__(self, primitive):
        from jax._src.interpreters import mlir
        self.primitive = primitive
        self._default = mlir._lowerings.get(primitive)
        self._platforms = {p: rules[primitive] for p, rules in mlir._platform_specific_lowerings.items()
                           if primitive in rules}
        self._uncacheable = primitive in mlir._uncacheable_primitives

    @property
    def default(self):
        """The rule for platforms without one of their own, or None."""
        return self._default.rule if self._default is not None else None

    @property
    def platforms(self) -> dict:
        """Platform name -> the rule for that platform, where one was registered for it."""
        return {p: entry.rule for p, entry in self._platforms.items()}

    def restore(self) -> None:
        """Put back exactly the rules saved: a rule registered since for a platform that had none is removed."""
        from jax._src.interpreters import mlir
        p = self.primitive
        if self._default is None:
            mlir._lowerings.pop(p, None)
        else:
            mlir._lowerings[p] = self._default
        for platform, rules in mlir._platform_specific_lowerings.items():
            if platform in self._platforms:
                rules[p] = self._platforms[platform]
            else:
                rules.pop(p, None)
        if self._uncacheable:
            mlir._uncacheable_primitives.add(p)
        else:
            mlir._uncacheable_primitives.discard(p)
