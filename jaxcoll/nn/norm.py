"""jaxcoll.nn.norm and jaxcoll.nn.dense_norm: the row norm of a transformer's residual stream for `jax.jit`
programs with shardings, partitioned by jaxcoll (`jax.experimental.custom_partitioning`).

`norm(x + bias + residual)` needs no communication while the hidden dimension is whole: rows (batch, sequence)
keep whatever sharding they have. What needs communication is the row-parallel product in front of it, whose
partial sums XLA's partitioner would all-reduce; `dense_norm` takes that product in and partitions onto
`jaxcoll.fused.reduce_scatter_norm_all_gather` (CoCoNet's fusion: reduce-scatter, the epilogue on 1/p of the
rows, all-gather):

| x (..., S, K)           | w (K, F)        | result (..., S, F)     | runs                                        |
|-------------------------|-----------------|------------------------|---------------------------------------------|
| K sharded over a        | K sharded over a| not sharded over a     | local product, reduce_scatter_norm_all_gather |
| K sharded over a        | K sharded over a| S sharded over a       | matmul_reduce_scatter, norm on the rank's rows |
| otherwise               | F whole         | rows as x              | local product and norm                      |

The gradients are partitioned ops too: the norm's backward (`_norm_grad`) works on the rows a device holds and
sums the scale, bias and offset gradients over the axes that shard the rows with one `jaxcoll.all_reduce`; the
product's backward is `jaxcoll.nn.dense`'s. A training step built from these and `jaxcoll.nn.dense` holds no XLA
collective for its layers.

The hidden dimension (F) is never split: the partition rules ask for it whole, so an F-sharded operand is
gathered by XLA in front of the op (no Megatron layout shards the residual stream's hidden dimension).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcoll import fused
from jaxcoll.fused import comm
from jaxcoll.fused.collective_matmul import _dot, check_matmul_operands
from jaxcoll.fused.norm import check_epilogue, check_norm, row_norm
from jaxcoll.nn.dense import _dense, _layout, _name, _spec, _weight_grad


def _rows(info):
    """The spec of an operand's row dimensions (all but the last), each one mesh axis name or None."""
    return [_name(e) for e in _spec(info.sharding, len(info.shape))[:-1]]


def _row_axes(rows) -> tuple:
    return tuple(a for a in rows if a is not None)


def _norm_h(h, scale, offset, cfg):
    norm, eps = cfg[:2]
    return row_norm(h, scale, offset if norm == "layernorm" else None, norm, eps)


# -- the norm: local on any row sharding -----------------------------------------------------------------------


@functools.cache
def _norm_op(cfg):
    """(y, h) = (norm(h), h) with h = x + bias (+ residual), as a partitioned op; one per configuration, so that
    each has a fixed Shardy rule."""

    def fun(x, scale, bias, offset, residual):
        h = x + bias if residual is None else x + bias + residual
        return _norm_h(h, scale, offset, cfg), h

    def layout(mesh, arg_infos):
        rows = P(*_rows(arg_infos[0]), None)
        vec = NamedSharding(mesh, P(None))
        args = (NamedSharding(mesh, rows), vec, vec, vec, NamedSharding(mesh, rows) if cfg[2] else None)
        return args, (NamedSharding(mesh, rows),) * 2

    def partition(mesh, arg_infos, out_info):
        args, outs = layout(mesh, arg_infos)
        return mesh, fun, outs, args

    op = custom_partitioning(fun)
    op.def_partition(partition=partition,
                     infer_sharding_from_operands=lambda mesh, arg_infos, out: layout(mesh, arg_infos)[1],
                     sharding_rule="... h, h, h, h" + (", ... h" if cfg[2] else "") + " -> ... h, ... h")
    return op


@functools.cache
def _norm_grad(cfg):
    """(dh, dscale, dbias, doffset) of (y, h) = (norm(h) * scale + offset, h) for the cotangents (dy, dh):
    rows local, the vector gradients summed over the row axes in one all-reduce."""

    def local(h, scale, offset, dy, dh):
        _, vjp = jax.vjp(lambda h, s, o: _norm_h(h, s, o, cfg), h, scale, offset)
        dh_norm, dscale, doffset = vjp(dy)
        dh = dh + dh_norm
        lead = tuple(range(h.ndim - 1))
        return dh, dscale, jnp.sum(dh, axis=lead).astype(scale.dtype), doffset

    def layout(mesh, arg_infos):
        rows = NamedSharding(mesh, P(*_rows(arg_infos[0]), None))
        vec = NamedSharding(mesh, P(None))
        return (rows, vec, vec, rows, rows), (rows, vec, vec, vec)

    def partition(mesh, arg_infos, out_info):
        args, outs = layout(mesh, arg_infos)
        axes = _row_axes(_rows(arg_infos[0]))

        def lower(h, scale, offset, dy, dh):
            dh, dscale, dbias, doffset = local(h, scale, offset, dy, dh)
            if axes:  # the rows' contributions on every device holding other rows: one all-reduce of 3 vectors
                n = scale.shape[0]
                summed = comm.all_reduce(jnp.concatenate([dscale, dbias, doffset]),
                                         axes if len(axes) > 1 else axes[0])
                dscale, dbias, doffset = summed[:n], summed[n:2 * n], summed[2 * n:]
            return dh, dscale, dbias, doffset

        return mesh, lower, outs, args

    op = custom_partitioning(local)
    op.def_partition(partition=partition,
                     infer_sharding_from_operands=lambda mesh, arg_infos, out: layout(mesh, arg_infos)[1],
                     sharding_rule="... h, h, h, ... h, ... h -> ... h, h, h, h")
    return op


def _vector(v, like):
    return jnp.zeros(like.shape[-1:], like.dtype) if v is None else v


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _norm(x, scale, bias, offset, residual, cfg):
    return _norm_op(cfg)(x, scale, bias, offset, residual)


def _norm_fwd(x, scale, bias, offset, residual, cfg):
    y, h = _norm(x, scale, bias, offset, residual, cfg)
    return (y, h), (h, scale, offset)


def _norm_bwd(cfg, res, cts):
    h, scale, offset = res
    dh, dscale, dbias, doffset = _norm_grad(cfg[:2])(h, scale, offset, *cts)
    return dh, dscale, dbias, doffset, dh if cfg[2] else None


_norm.defvjp(_norm_fwd, _norm_bwd)


def _check_operands(api, x, scale, bias, offset, residual, norm):
    check_norm(api, norm, offset)
    if x.ndim < 2:
        raise ValueError(f"{api}: x must be (rows..., H), got x.shape={tuple(x.shape)}")
    check_epilogue(api, x, "residual", residual, x.shape)
    for name, v in (("scale", scale), ("bias", bias), ("offset", offset)):
        check_epilogue(api, x, name, v, x.shape[-1:])


def norm(x, scale, *, residual=None, bias=None, offset=None, norm: str = "rmsnorm", eps: float = 1e-6,
         return_residual: bool = False):
    """`h = x + bias + residual; norm(h) * scale (+ offset)` over the last dimension, for `jax.jit` with shardings.

    x (rows..., H) and `residual` (x's shape) may be sharded along any row dimension; `scale`, `bias`, `offset`
    have shape (H,). `norm` is "rmsnorm" or "layernorm" (with `offset`). Returns the normed rows, and h (the new
    residual stream) as well with `return_residual=True`. The forward pass is local to each device's rows; in the
    backward pass the gradients of scale, bias and offset are summed over the devices holding other rows with
    `jaxcoll.all_reduce`.
    """
    api = "jaxcoll.nn.norm"
    _check_operands(api, x, scale, bias, offset, residual, norm)
    cfg = (norm, float(eps), residual is not None)  # static: the configuration picks the partitioned op
    y, h = _norm(x, scale, _vector(bias, x), _vector(offset, x), residual, cfg)
    return (y, h) if return_residual else y


# -- the row-parallel product with the norm after it ----------------------------------------------------------


def _dense_norm_layout(mesh, x_info, w_info, out_info, residual):
    """(mode, axis, x_spec, w_spec, out_spec, residual_spec) for one dense_norm call."""
    mode, a, x_spec, w_spec, out_spec = _layout(mesh, x_info, w_info, out_info)
    if mode == "row_all_reduce":
        nd = len(x_info.shape)
        rows = int(np.prod(x_info.shape[:-1])) // int(np.prod([mesh.shape[b] for b in _row_axes(out_spec)]))
        if rows % mesh.shape[a] == 0:  # reduce_scatter_norm_all_gather splits the device's rows over a
            mode = "row_norm"
        out_spec = P(*out_spec[:nd - 1], None)
    elif mode != "row_scatter":  # the norm needs whole rows of F: the product is local with w's F whole
        mode, a = "local", None
        x_spec = P(*x_spec[:-1], None)
        w_spec, out_spec = P(None, None), P(*x_spec[:-1], None)
    return mode, a, x_spec, w_spec, out_spec, (out_spec if residual else None)


@functools.cache
def _dense_norm_op(cfg):
    """(y, h) = (norm(h), h), h = x @ w + bias (+ residual), as a partitioned op (see the module docstring)."""

    def fun(x, w, scale, bias, offset, residual):
        h = (x @ w + bias) if residual is None else (x @ w + bias + residual)
        return _norm_h(h, scale, offset, cfg), h

    def layout(mesh, arg_infos, out_info):
        x_info, w_info = arg_infos[:2]
        mode, a, x_spec, w_spec, out_spec, r_spec = _dense_norm_layout(mesh, x_info, w_info, out_info, cfg[2])
        s = lambda spec: None if spec is None else NamedSharding(mesh, spec)
        vec = s(P(None))
        return mode, a, (s(x_spec), s(w_spec), vec, vec, vec, s(r_spec)), (s(out_spec),) * 2

    def partition(mesh, arg_infos, out_info):
        mode, a, args, outs = layout(mesh, arg_infos, out_info[0])
        seq_axis = len(arg_infos[0].shape) - 2
        norm, eps = cfg[:2]

        def lower(x, w, scale, bias, offset, residual):
            if mode == "row_norm":
                partial = _dot(x, w).astype(x.dtype)
                shape = partial.shape
                flat = lambda v: v.reshape(-1, shape[-1])
                y, h = fused.reduce_scatter_norm_all_gather(
                    flat(partial), a, scale=scale, bias=bias, offset=offset if norm == "layernorm" else None,
                    residual=None if residual is None else flat(residual), norm=norm, eps=eps,
                    return_residual=True)
                return y.reshape(shape), h.reshape(shape)
            if mode == "row_scatter":
                h = fused.matmul_reduce_scatter(x, w, a, scatter_axis=seq_axis) + bias
            elif mode == "row_all_reduce":
                h = fused.matmul_all_reduce(x, w, a, bias=bias)
            else:
                h = x @ w + bias
            if residual is not None:
                h = h + residual
            return _norm_h(h, scale, offset, cfg), h

        return mesh, lower, outs, args

    op = custom_partitioning(fun)
    op.def_partition(partition=partition,
                     infer_sharding_from_operands=lambda mesh, arg_infos, out: layout(
                         mesh, arg_infos, arg_infos[0])[3],
                     sharding_rule="... s k, k f, f, f, f" + (", ... t f" if cfg[2] else "")
                     + " -> ... t f, ... t f")
    return op


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _dense_norm(x, w, scale, bias, offset, residual, cfg):
    return _dense_norm_op(cfg)(x, w, scale, bias, offset, residual)


def _dense_norm_fwd(x, w, scale, bias, offset, residual, cfg):
    y, h = _dense_norm(x, w, scale, bias, offset, residual, cfg)
    return (y, h), (x, w, h, scale, offset)


def _dense_norm_bwd(cfg, res, cts):
    x, w, h, scale, offset = res
    dh, dscale, dbias, doffset = _norm_grad(cfg[:2])(h, scale, offset, *cts)
    # the product's backward: jaxcoll.nn.dense's partitioned products (dx is the partner layout of the forward)
    return (_dense(dh, w.T), _weight_grad(x, dh), dscale, dbias, doffset, dh if cfg[2] else None)


_dense_norm.defvjp(_dense_norm_fwd, _dense_norm_bwd)


def dense_norm(x, w, scale, *, residual=None, bias=None, offset=None, norm: str = "rmsnorm", eps: float = 1e-6,
               return_residual: bool = False):
    """`h = x @ w + bias + residual; norm(h) * scale (+ offset)` for `jax.jit` with shardings: the row-parallel
    layer of a transformer block with the residual add and the next block's norm fused into its all-reduce.

    x (..., S, K), w (K, F); `residual` has the result's shape (..., S, F); `scale`, `bias`, `offset` have shape
    (F,). With x and w sharded on K over a mesh axis a (row parallel) the product's partial sums go through
    `jaxcoll.fused.reduce_scatter_norm_all_gather` (result replicated over a), or, when the result is
    constrained sequence-sharded over a, through `matmul_reduce_scatter` and a norm of the rank's rows (see the
    module docstring). Returns the normed rows, and h as well with `return_residual=True`. Differentiable.
    """
    api = "jaxcoll.nn.dense_norm"
    check_matmul_operands(api, x, w)
    if x.ndim < 2:
        raise ValueError(f"{api}: x must be (..., S, K), got x.shape={tuple(x.shape)}")
    out = jax.ShapeDtypeStruct(x.shape[:-1] + w.shape[1:], x.dtype)
    _check_operands(api, out, scale, bias, offset, residual, norm)
    cfg = (norm, float(eps), residual is not None)
    y, h = _dense_norm(x, w, scale, _vector(bias, out), _vector(offset, out), residual, cfg)
    return (y, h) if return_residual else y
