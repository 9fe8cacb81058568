"""jaxcoll.nn.embed: a token-embedding lookup for `jax.jit` programs with shardings, partitioned by jaxcoll
(`jax.experimental.custom_partitioning`).

The lookup itself is local to the rows (tokens) a device holds, with the table replicated. Its gradient is a
scatter-add of the rows' cotangents into the table, which every device holding other rows contributes to: XLA's
partitioner would all-reduce it; here the sum is one `jaxcoll.all_reduce` over the axes that shard the rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcoll.fused import comm
from jaxcoll.nn.dense import _name, _spec

API = "jaxcoll.nn.embed"


def _rows(mesh, tokens_info):
    return P(*[_name(e) for e in _spec(tokens_info.sharding, len(tokens_info.shape))])


@functools.cache
def _lookup_op():
    def layout(mesh, arg_infos):
        rows = _rows(mesh, arg_infos[1])
        return (NamedSharding(mesh, P(None, None)), NamedSharding(mesh, rows)), NamedSharding(mesh, P(*rows, None))

    def partition(mesh, arg_infos, out_info):
        args, out = layout(mesh, arg_infos)
        return mesh, lambda table, tokens: jnp.take(table, tokens, axis=0), out, args

    op = custom_partitioning(lambda table, tokens: jnp.take(table, tokens, axis=0))
    op.def_partition(partition=partition,
                     infer_sharding_from_operands=lambda mesh, arg_infos, out: layout(mesh, arg_infos)[1],
                     sharding_rule="v d, ... -> ... d")
    return op


def _scatter_add(vocab, tokens, dy):
    return jnp.zeros((vocab, dy.shape[-1]), dy.dtype).at[tokens].add(dy)


@functools.cache
def _grad_op(vocab: int):
    """The table's gradient for a vocabulary of `vocab` rows (the scatter-add needs it; the cotangent has no V)."""

    def layout(mesh, arg_infos):
        rows = _rows(mesh, arg_infos[0])
        args = (NamedSharding(mesh, rows), NamedSharding(mesh, P(*rows, None)))
        return rows, args, NamedSharding(mesh, P(None, None))

    def partition(mesh, arg_infos, out_info):
        rows, args, out = layout(mesh, arg_infos)
        axes = tuple(a for a in rows if a is not None)

        def lower(tokens, dy):
            dtable = _scatter_add(vocab, tokens, dy)
            return comm.all_reduce(dtable, axes if len(axes) > 1 else axes[0]) if axes else dtable

        return mesh, lower, out, args

    op = custom_partitioning(functools.partial(_scatter_add, vocab))
    op.def_partition(partition=partition,
                     infer_sharding_from_operands=lambda mesh, arg_infos, out: layout(mesh, arg_infos)[2],
                     sharding_rule="..., ... d -> v d")
    return op


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _embed(table, tokens, vocab):
    return _lookup_op()(table, tokens)


def _embed_fwd(table, tokens, vocab):
    return _embed(table, tokens, vocab), tokens


def _embed_bwd(vocab, tokens, dy):
    return _grad_op(vocab)(tokens, dy), np.zeros(tokens.shape, jax.dtypes.float0)


_embed.defvjp(_embed_fwd, _embed_bwd)


def embed(table, tokens):
    """`table[tokens]` (`jnp.take(table, tokens, axis=0)`) for `jax.jit` with shardings: table (V, D), kept
    whole on every device; tokens (...) integer indices in [0, V), sharded in any way; returns (..., D) sharded
    like the tokens. Differentiable in `table`: the gradient is summed over the devices' rows with
    `jaxcoll.all_reduce`."""
    if np.ndim(table) != 2:
        raise ValueError(f"{API}: table must be (V, D), got table.shape={tuple(np.shape(table))}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(f"{API}: tokens must be integer indices, got tokens.dtype={tokens.dtype}")
    return _embed(table, tokens, table.shape[0])
