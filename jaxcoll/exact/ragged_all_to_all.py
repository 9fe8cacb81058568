"""The exact ragged all_to_all: lax.ragged_all_to_all's contract, run on jaxcoll's all_to_all.

Each rank's K slices (K/N for each of the N ranks of its group) travel as blocks of one fixed size, R rows: the
largest slice the contract allows (a slice fits in the sender's operand and in the receiver's output). One
all_to_all moves the blocks, a second one moves the offsets each sender chose in its receivers' outputs, and
each receiver writes the first recv_sizes[i] rows of block i at its offset, leaving every other row of
`output` as it was. jaxcoll's plans move chunks whose sizes follow from the message size, not from values
computed at run time, so the padding to R rows is what runs the ragged exchange on every executor (CPU, CUDA,
across processes) without a collective of its own: K * R rows leave each rank, where a native ragged exchange
would send only the rows of its slices (docs/replace.md, "ragged_all_to_all").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxcoll import _jax
from jaxcoll.exact.all_to_all import all_to_all
from jaxcoll.exact.arguments import leaf_array
from jaxcoll.lowering import groups

API = "jaxcoll.ragged_all_to_all"


def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, axis_name, *,
                      algorithm="auto", axis_index_groups=None):
    """`output` with the slices the group's ranks send to this one written in it (lax.ragged_all_to_all).

    Slice i of this rank, `operand[input_offsets[i]:input_offsets[i] + send_sizes[i]]`, goes to rank
    i // (K / N) of the group, which writes it at rows `output_offsets[i]` on; this rank writes the slice i it
    receives (from rank i // (K / N)) at the offset its sender gave, `recv_sizes[i]` rows. Rows nothing is
    written to keep `output`'s values. `algorithm` is the all_to_all's.
    """
    axes = groups.axis_names(axis_name, API)
    axis_index_groups = groups.index_groups(API, axis_index_groups, axes)
    n = groups.group_size(axes, axis_index_groups)
    operand, output = leaf_array(API, operand), leaf_array(API, output)
    if operand.ndim == 0 or operand.shape[1:] != output.shape[1:] or operand.dtype != output.dtype:
        raise ValueError(f"{API}: operand ({operand.dtype}{list(operand.shape)}) and output "
                         f"({output.dtype}{list(output.shape)}) must be arrays of one dtype whose shapes differ "
                         f"only in their leading dimension")
    slices = _slice_arguments(input_offsets=input_offsets, send_sizes=send_sizes, output_offsets=output_offsets,
                              recv_sizes=recv_sizes)
    k = slices["input_offsets"].shape[0]
    if k % n:
        raise ValueError(f"{API}: input_offsets, send_sizes, output_offsets and recv_sizes have {k} entries, "
                         f"which the group of {n} ranks over axis_name={axes} does not divide")
    check_typing([jax.typeof(v) for v in (operand, output, *slices.values())], axes)
    if _jax.check_vma():
        # Every operand joins output's varying axes through jaxcoll's pvary (whose transpose runs on jaxcoll)
        # rather than through the casts jax would insert (whose transposes are XLA's psums).
        vary = tuple(_jax.varying_axes(jax.typeof(output)))
        operand = groups.pvary_missing(operand, vary)
        slices = {name: groups.pvary_missing(v, vary) for name, v in slices.items()}
    rows = min(operand.shape[0], output.shape[0])
    if rows == 0:
        return output
    within = jnp.arange(rows, dtype=np.int32)
    taken = jnp.take(operand, slices["input_offsets"][:, None] + within, axis=0, mode="clip")
    exchange = dict(algorithm=algorithm, axis_index_groups=axis_index_groups, tiled=True)
    received = all_to_all(taken, axes, 0, 0, **exchange)
    offsets = all_to_all(slices["output_offsets"], axes, 0, 0, **exchange)
    # Rows past a slice's size go to row output.shape[0], which mode="drop" leaves unwritten.
    target = jnp.where(within < slices["recv_sizes"][:, None], offsets[:, None] + within, output.shape[0])
    return output.at[target.reshape(-1)].set(received.reshape(k * rows, *output.shape[1:]), mode="drop")


def check_typing(avals, axes: tuple) -> None:
    """ValueError unless, under shard_map(check_vma=True), the result can be typed as lax types it, like `output`
    (avals[1]): output must vary over the axes and over every axis another operand varies over, since the
    result is computed from them all and a varying value cannot be cast back to invariant."""
    if not _jax.check_vma():
        return
    needed = set(axes).union(*(_jax.varying_axes(a) for a in avals))
    missing = needed - _jax.varying_axes(avals[1])
    if missing:
        raise ValueError(f"{API}: output varies over {sorted(_jax.varying_axes(avals[1]))}, but the result, which "
                         f"lax types like output, would vary over {sorted(needed)}; make output vary over "
                         f"{sorted(missing)} too (jax.lax.pcast(output, {tuple(sorted(missing))}, to='varying'))")


def _slice_arguments(**arguments) -> dict:
    """Each argument as an int32 vector, all of one positive length; ValueError naming the argument otherwise."""
    out = {}
    for name, value in arguments.items():
        value = jnp.asarray(value)
        if not jnp.issubdtype(value.dtype, jnp.integer) or value.ndim != 1 or value.shape[0] < 1:
            raise ValueError(f"{API}: {name} must be a non-empty vector of integers, got "
                             f"{value.dtype}{list(value.shape)}")
        out[name] = value.astype(np.int32)
    lengths = {name: v.shape[0] for name, v in out.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{API}: input_offsets, send_sizes, output_offsets and recv_sizes must have one length, "
                         f"got {lengths}")
    return out
