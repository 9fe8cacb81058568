"""Groups and ranks: how a collective's mesh axes map to the group a device belongs to and its rank in it.

A collective over axes A of a mesh runs one independent group per combination of the mesh's other axes. A
device's *rank* is its position along A, linearized row-major in the order A is written (the order
`lax.axis_index` and `lax.all_gather` use for a tuple of axes); its *group* is its position along the other
axes, linearized row-major in mesh order. Both are computed on the device, in the lowered program, because in
an SPMD program every device sees the same attributes (docs/plan-ir.md, "The custom call").

`axis_index_groups` (lax's argument) splits each of those groups further: index group g lists positions along
A, and the device at position `axis_index_groups[g][i]` is rank i of its own group. The runtime sees no
difference: a group is a group, keyed by its number, with its own communicator and a plan for its size.
"""

from __future__ import annotations

import math

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from jaxcoll import _jax


def axis_names(axis_name, api_name: str) -> tuple:
    """`axis_name` as a tuple of names, each bound by an enclosing shard_map (or vmap); NameError otherwise."""
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    if not axes:
        raise ValueError(f"{api_name}: axis_name must name at least one mesh axis, got axis_name={axis_name!r}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"{api_name}: axis_name={axis_name!r} repeats an axis")
    env = _jax.axis_env()
    for name in axes:
        if isinstance(name, int) or not env.axis_exists(name):
            raise NameError(f"{api_name}: unbound axis name axis_name={name!r}. Call {api_name} inside "
                            f"jax.shard_map over a mesh with that axis.")
    return axes


def ppermute_axes(axes: tuple) -> tuple:
    """`axes` in the order lax.ppermute numbers the ranks of a tuple of axes, under the running JAX.

    The contract changed in jax 0.11. Up to 0.10 lax.ppermute numbers ranks in the mesh's order of the axes,
    whatever the order of the tuple (unlike lax.axis_index and lax.all_gather, which follow the tuple). From
    0.11 it follows the tuple too, and raises by default when that order differs from the mesh's (config
    `jax_raise_on_ppermute_sort_diff`, checked at lowering: `check_ppermute_order`). The config option exists
    exactly on the versions with the new contract, so its presence tells which contract to follow (checked on
    jax 0.10.2: absent, mesh order; 0.11.2 and 0.12.0.1: present, tuple order).
    """
    if _ppermute_order_check() is not None:
        return axes
    from jax.sharding import get_abstract_mesh
    order = tuple(get_abstract_mesh().axis_names)
    # Names the mesh does not have (vmap axes) keep their place at the end.
    return tuple(sorted(axes, key=lambda a: order.index(a) if a in order else len(order)))


def _ppermute_order_check() -> bool | None:
    """jax.config's `jax_raise_on_ppermute_sort_diff` (jax >= 0.11; the value of the enclosing context), or None
    on versions without it."""
    import jax
    return getattr(jax.config, "jax_raise_on_ppermute_sort_diff", None)


def check_ppermute_order(ctx, axes: tuple, api_name: str) -> None:
    """RuntimeError, as lax.ppermute raises it, when the check is on and the ranks of `axes` (numbered in the
    tuple's order) are not numbered as the mesh orders its devices: two axes of more than one device each
    appear in the tuple in the opposite order to the mesh's."""
    if not _ppermute_order_check():
        return
    shape = _mesh_shape(ctx)
    order = list(shape)
    spread = [order.index(a) for a in axes if a in shape and shape[a] > 1]
    if spread != sorted(spread):
        raise RuntimeError(
            f"{api_name}: axis_name={axes} is not in the order the mesh declares its axes ({tuple(order)}), "
            f"as jax.lax.ppermute requires since jax 0.11. Pass the axes in mesh order, or allow another order "
            f"by turning off the check: jax.config.update('jax_raise_on_ppermute_sort_diff', False)")


def group_size(axes: tuple, axis_index_groups: tuple | None = None) -> int:
    """Number of ranks in each group of a collective over `axes`, split by `axis_index_groups` (trace time)."""
    if axis_index_groups is not None:
        return len(axis_index_groups[0])
    env = _jax.axis_env()
    return math.prod(env.axis_size(name) for name in axes)


def index_groups(api_name: str, axis_index_groups, axes: tuple) -> tuple[tuple[int, ...], ...] | None:
    """`axis_index_groups` as a tuple of tuples of ints, checked to split the positions along `axes` into groups
    of one size (jaxcoll runs one plan for every group of a call); ValueError naming the argument and the value
    otherwise. lax checks only that the groups cover the indices of their union once; a partition of fewer
    positions than the axes have, or groups of unequal size, are left to XLA's compiler there."""
    if axis_index_groups is None:
        return None
    try:
        value = tuple(tuple(map(_index, g)) for g in axis_index_groups)
    except TypeError:
        raise ValueError(f"{api_name}: axis_index_groups={axis_index_groups!r} must be a sequence of groups, each a "
                         f"sequence of int axis indices") from None
    n = group_size(axes)
    bad = lambda why: ValueError(f"{api_name}: axis_index_groups={value!r} {why}")  # noqa: E731
    if not value or not all(value):
        raise bad("must hold at least one group, and no empty group")
    flat = [i for g in value for i in g]
    outside = sorted({i for i in flat if not 0 <= i < n})
    if outside:
        raise bad(f"has indices {outside} outside axis_name={axes}, whose indices are 0..{n - 1}")
    repeated = sorted({i for i in flat if flat.count(i) > 1})
    if repeated:
        raise bad(f"has groups that overlap: indices {repeated} appear more than once")
    missing = sorted(set(range(n)) - set(flat))
    if missing:
        raise bad(f"does not cover axis_name={axes} of size {n}: indices {missing} are in no group")
    sizes = sorted({len(g) for g in value})
    if len(sizes) > 1:
        raise bad(f"has groups of unequal sizes {sizes}; every group must have the same size")
    return value


def _index(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(value)
    return int(value)


def check_varying(api_name: str, axes: tuple, aval) -> None:
    """Collectives act on values that vary over their axes (the public functions pvary invariant inputs)."""
    if _jax.check_vma() and any(a not in _jax.varying_axes(aval) for a in axes):
        raise ValueError(f"{api_name} must be applied to a value varying over axis_name={axes}, but the "
                         f"value varies over {sorted(_jax.varying_axes(aval))}")


def pvary_missing(x, axes: tuple):
    """Make `x` varying over `axes`, as jax.lax does before a collective: an invariant value is the same on
    every rank, and the collective then combines N equal copies of it. The cast is jaxcoll's pvary, so its
    transpose (a psum of the cotangents) runs on jaxcoll too."""
    if not _jax.check_vma():
        return x
    import jax
    from jaxcoll.lowering import pvary
    missing = tuple(a for a in axes if a not in _jax.varying_axes(jax.typeof(x)))
    return pvary.bind(x, axes=missing) if missing else x


def named_axis_effects(axes: tuple) -> set:
    return {_jax.named_axis_effect(a) for a in axes}


# -- lowering ------------------------------------------------------------------------------------------------

def _mesh_shape(ctx) -> dict:
    axis_ctx = ctx.module_context.axis_context
    mesh = getattr(axis_ctx, "mesh", None)
    if mesh is None:
        raise NameError("jaxcoll collectives must run inside jax.shard_map: the lowering has no mesh")
    return dict(zip(mesh.axis_names, mesh.axis_sizes))


def lowered_group_size(ctx, axes: tuple, axis_index_groups: tuple | None = None) -> int:
    if axis_index_groups is not None:
        return len(axis_index_groups[0])
    shape = _mesh_shape(ctx)
    return math.prod(shape[a] for a in axes)


def _positions(axis_index_groups: tuple, nranks: int) -> tuple[np.ndarray, np.ndarray]:
    """(which index group, position in it) of each position along the axes."""
    which, position = np.empty(nranks, np.int32), np.empty(nranks, np.int32)
    for g, members in enumerate(axis_index_groups):
        for i, member in enumerate(members):
            which[member], position[member] = g, i
    return which, position


def _s32(value: int) -> ir.Value:
    return _jax.ir_constant(np.asarray(value, dtype=np.int32))


def _linear_index(ctx, names: tuple, sizes: tuple) -> ir.Value:
    """Row-major index over `names`, computed on the device from its partition id."""
    index = _s32(0)
    for name, size in zip(names, sizes):
        if size == 1:
            continue
        i = _jax.axis_index_hlo(ctx, name)
        index = hlo.add(hlo.multiply(index, _s32(size)), i)
    return index


def process_map(ctx, axes: tuple, axis_index_groups: tuple | None = None) -> np.ndarray | None:
    """Which process hosts each rank of each group: int32 [group * nranks + rank] -> jax process index, with rank
    and group numbered as `rank_and_group` numbers them; None when the whole mesh is in this process (the
    runtime then keeps every group in-process, as in a single-process program)."""
    import jax
    if jax.process_count() == 1:
        return None
    mesh = ctx.module_context.axis_context.mesh
    devices = getattr(mesh, "devices", None)
    if devices is None:
        raise ValueError(
            f"jaxcoll collectives over axes {axes} in a job of {jax.process_count()} processes need the mesh's "
            f"devices to know which process hosts each rank, but shard_map was given an abstract mesh "
            f"({mesh}); pass a concrete mesh (jax.make_mesh or jax.sharding.Mesh)")
    out = np.empty(devices.size, np.int32)
    for at, _, index in _mesh_positions(mesh, axes, axis_index_groups):
        out[index] = devices[at].process_index
    return None if (out == out[0]).all() else out


def _mesh_positions(mesh, axes: tuple, axis_index_groups: tuple | None = None):
    """(mesh coordinates, row-major position, group * nranks + rank) of every device of a concrete mesh, with rank
    and group numbered as `rank_and_group` numbers them."""
    names = tuple(mesh.axis_names)
    shape = dict(zip(names, mesh.devices.shape))
    others = tuple(a for a in names if a not in axes)
    nranks = math.prod(shape[a] for a in axes)
    if axis_index_groups is not None:
        which, position = _positions(axis_index_groups, nranks)
    for flat, coords in enumerate(np.ndindex(*mesh.devices.shape)):
        at = dict(zip(names, coords))
        rank = group = 0
        for a in axes:
            rank = rank * shape[a] + at[a]
        for a in others:
            group = group * shape[a] + at[a]
        if axis_index_groups is not None:
            rank, group = int(position[rank]), group * len(axis_index_groups) + int(which[rank])
            yield coords, flat, group * len(axis_index_groups[0]) + rank
        else:
            yield coords, flat, group * nranks + rank


def device_ids(ctx, axes: tuple, axis_index_groups: tuple | None = None) -> np.ndarray:
    """Each rank's device as XLA numbers the program's devices: int64 [group * nranks + rank] -> the device's
    position in the mesh's devices (row-major), which is its partition id, and so its flattened id in XLA's
    replica groups, in a jit over that mesh (one replica)."""
    mesh = ctx.module_context.axis_context.mesh
    out = np.empty(mesh.devices.size, np.int64)
    for _, flat, index in _mesh_positions(mesh, axes, axis_index_groups):
        out[index] = flat
    return out


def lookup(ctx, table: np.ndarray, rank: ir.Value, group: ir.Value, nranks: int) -> ir.Value:
    """table[group * nranks + rank] as an s32 scalar of the lowered program (a per-device value from a constant
    table indexed by the device's rank and group)."""
    return _pick(table, hlo.add(hlo.multiply(group, _s32(nranks)), rank))


def _pick(table: np.ndarray, index: ir.Value) -> ir.Value:
    """table[index] as an s32 scalar of the lowered program."""
    constant = _jax.ir_constant(np.asarray(table, np.int32))
    picked = hlo.dynamic_slice(constant, [index], ir.DenseI64ArrayAttr.get([1]))
    return hlo.reshape(ir.RankedTensorType.get([], ir.IntegerType.get_signless(32)), picked)


def process_layout(processes: np.ndarray | None, nranks: int) -> tuple[int, ...] | None:
    """The process layout every group shares, for the plan (one plan serves all groups of a call site): rank r's
    process, numbered by first appearance within the group; None in one process, or when groups are laid out
    differently (the plan then assumes nothing about processes)."""
    if processes is None:
        return None
    layouts = set()
    for g in range(len(processes) // nranks):
        seen: dict[int, int] = {}
        layouts.add(tuple(seen.setdefault(int(p), len(seen)) for p in processes[g * nranks:(g + 1) * nranks]))
    return layouts.pop() if len(layouts) == 1 else None


def host_layout(processes: np.ndarray | None, hosts, nranks: int) -> tuple[int, ...] | None:
    """The host of each of the group's processes (numbered as `process_layout` numbers them, hosts by first
    appearance), when every group has the same one and it names several hosts; None otherwise."""
    if processes is None or hosts is None:
        return None
    layouts = set()
    for g in range(len(processes) // nranks):
        order: dict[int, int] = {}
        for p in processes[g * nranks:(g + 1) * nranks]:
            order.setdefault(int(p), len(order))
        seen: dict[int, int] = {}
        layouts.add(tuple(seen.setdefault(int(hosts[p]), len(seen)) for p in order))
    layout = layouts.pop() if len(layouts) == 1 else None
    return layout if layout is not None and len(set(layout)) > 1 else None


def rank_and_group(ctx, axes: tuple, axis_index_groups: tuple | None = None) -> tuple[ir.Value, ir.Value]:
    """(rank, group) s32 scalars of this device for a collective over `axes`, split by `axis_index_groups`."""
    shape = _mesh_shape(ctx)
    others = tuple(a for a in shape if a not in axes)
    rank = _linear_index(ctx, axes, tuple(shape[a] for a in axes))
    group = _linear_index(ctx, others, tuple(shape[a] for a in others))
    if axis_index_groups is not None:
        which, position = _positions(axis_index_groups, math.prod(shape[a] for a in axes))
        group = hlo.add(hlo.multiply(group, _s32(len(axis_index_groups))), _pick(which, rank))
        rank = _pick(position, rank)
    return rank, group
