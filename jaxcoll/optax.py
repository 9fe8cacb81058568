"""Gradient synchronisation as an optax GradientTransformation: jaxcoll's compressed all-reduce with error
feedback, for data-parallel training inside jax.shard_map.

Error feedback (Seide et al. 2014; Karimireddy et al. 2019, "EF-SGD"): each rank adds to its gradient the part
that its last compression lost, and keeps the new loss for the next step, so every gradient entry is applied
in full over time and compressed SGD converges like SGD. The residual lives in the optimizer state; it differs
from rank to rank (it is this rank's compression error), so the state is varying over the data axis.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

try:
    import optax
except ImportError as e:  # optax is an extra: say how to get it rather than a bare "No module named optax"
    raise ImportError("jaxcoll.optax needs optax: pip install 'jaxcoll[optax]' (or pip install optax)") from e

from jaxcoll.collectives.all_reduce import all_reduce
from jaxcoll.compress import codec, formats, sparse, two_level
from jaxcoll.compress import collectives as compressed
from jaxcoll.lowering import groups

API = "jaxcoll.optax.compressed_sync"


class CompressedSyncState(NamedTuple):
    """residual: per leaf, this rank's compression error not yet applied, shaped (1, *leaf.shape) so that a
    state made inside shard_map stacks over the data axis (out_specs=P(axis)); None without error feedback."""

    residual: optax.Params | None


def compressed_sync(axis_name, compression="int8", *, error_feedback=True, mean=True, compress_axes=None):
    """A GradientTransformation that replaces each rank's gradient by the all-reduce of the gradients over
    `axis_name` (their mean with mean=True), sent compressed, with error feedback.

    Use it first in an optax chain, inside a shard_map'd step whose gradients vary over `axis_name`; call
    `init` inside the shard_map too (its residual is per rank) and give the state `P(axis_name)` specs:

        tx = optax.chain(jaxcoll.optax.compressed_sync("data", "int8"), optax.adam(1e-3))
        opt_state = jax.shard_map(tx.init, mesh=mesh, in_specs=P(), out_specs=P("data"))(params)

    Args:
      axis_name: the data-parallel mesh axis (or tuple of axes).
      compression: None (exact), "bf16", "fp8", "int8", a jaxcoll.compress format, or a
        `jaxcoll.compress.TopK` (sparse all-reduce). Checked when the update traces.
      error_feedback: keep each rank's compression error and add it to its next gradient.
      mean: divide the sum by the group size (data-parallel averaging).
      compress_axes: None, or the slow axes of `axis_name` (e.g. "host" of ("host", "local")): exact over the
        others, compressed only across these (`jaxcoll.all_reduce`'s compress_axes; "bf16", "fp8", "int8"). The
        residual is then the error of the chunk of the host's exact partial sum this rank encoded.

    Returns:
      optax.GradientTransformation; `update` returns updates invariant over `axis_name` (identical on every
      rank), as lax.pmean's are.
    """
    if compression is not None and not isinstance(compression, sparse.TopK):
        formats.parse(API, compression)  # fail at construction for an unknown name

    def init(params):
        if not error_feedback or compression is None:
            return CompressedSyncState(residual=None)
        return CompressedSyncState(residual=jax.tree_util.tree_map(
            lambda p: jnp.zeros((1, *jnp.shape(p)), jnp.result_type(p)), params))

    def update(updates, state, params=None):
        del params
        axes = groups.axis_names(axis_name, API)
        outer = compressed.compressed_axes(API, axes, compress_axes, compression, "auto")
        scale = 1.0 / groups.group_size(axes) if mean else 1.0
        if compression is None:
            return jax.tree_util.tree_map(lambda g: g * scale, all_reduce(updates, axes)), state
        if state.residual is not None:
            updates = jax.tree_util.tree_map(lambda g, r: g + r[0].astype(g.dtype), updates, state.residual)
        # One buffer for the whole model (gradient bucketing): one call per step, blocks and top-k groups span
        # the leaves, and no leaf's size has to be a multiple of the block size.
        flat, unflatten = _bucket(updates, 1 if isinstance(compression, sparse.TopK) else
                                  formats.parse(API, compression).block_size)
        if isinstance(compression, sparse.TopK):
            synced, lost = sparse.topk_leaf(flat, axes, compression, API)
        elif outer is not None:
            synced, lost = two_level.sum_and_loss(flat, axes, outer, formats.parse(API, compression),
                                                     loss=state.residual is not None)
        else:
            fmt = formats.parse(API, compression)
            synced = all_reduce(flat, axes, compression=fmt)
            # What this rank's first encoding lost (the chunks of the first hop are whole blocks of this
            # buffer); the owner's re-encoding of the sum is shared by all ranks, no one rank's to feed back.
            # The residual is a constant of the step: no derivative flows into the codec (native on CPU).
            lost = flat - codec.roundtrip(fmt, lax.stop_gradient(flat))
        synced = unflatten(synced * scale)
        if state.residual is None:
            return synced, state
        return synced, CompressedSyncState(residual=jax.tree_util.tree_map(lambda r: r[None], unflatten(lost)))

    return optax.GradientTransformation(init, update)


def _bucket(tree, block_size: int):
    """The leaves of `tree` as one float32 vector zero-padded to a multiple of block_size, and the function
    that turns such a vector back into the tree (each leaf in its dtype)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    sizes = [leaf.size for leaf in leaves]
    flat = jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in leaves])
    flat = jnp.pad(flat, (0, -flat.size % block_size))

    def unflatten(v):
        out, start = [], 0
        for leaf, size in zip(leaves, sizes):
            out.append(v[start:start + size].reshape(leaf.shape).astype(leaf.dtype))
            start += size
        return jax.tree_util.tree_unflatten(treedef, out)

    return flat, unflatten
