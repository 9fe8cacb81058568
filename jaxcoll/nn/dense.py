"""jaxcoll.nn.dense: `x @ w` for `jax.jit` programs with shardings, partitioned by jaxcoll.

XLA's partitioner would implement a sharded matrix product with its own all-gather and reduce-scatter; `dense`
is a `jax.experimental.custom_partitioning` op whose partition rule picks the jaxcoll fused op for the
layout it is given (Megatron-style tensor parallelism with sequence parallelism):

| x (..., S, H)           | w (H, F)        | result (..., S, F)    | runs                                  |
|-------------------------|-----------------|-----------------------|---------------------------------------|
| S sharded over a        | F sharded over a| F sharded over a      | all_gather_matmul along S (column)    |
| H sharded over a        | H sharded over a| S sharded over a      | matmul_reduce_scatter along S (row)   |
| H sharded over a        | H sharded over a| not sharded over a    | matmul_all_reduce (row)               |
| H not sharded           | F maybe sharded | F as w                | local product                         |

Leading (batch) dimensions of x keep their sharding (data parallelism). The Shardy sharding rule
"... s h, h f -> ... t f" gives the result's sequence dimension its own factor, so that propagation does not
tie it to x's: a column-parallel layer reads a sequence-sharded x and writes an unsharded sequence, a
row-parallel one the reverse. The gradient is two more partitioned products (dx = dy @ w.T is the partner
layout; dw contracts x and dy over their leading dimensions), so training stays on jaxcoll too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcoll import fused
from jaxcoll.fused import comm


def _spec(sharding, ndim):
    spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()
    return spec + (None,) * (ndim - len(spec))


def _name(entry):
    """A spec entry as one mesh axis name, or None (unsharded or sharded over several axes)."""
    if isinstance(entry, tuple):
        return entry[0] if len(entry) == 1 else None
    return entry


def _layout(mesh, x_info, w_info, out_info):
    """(mode, axis, x_spec, w_spec, out_spec) for one dense call."""
    nd = len(x_info.shape)
    xs = [_name(e) for e in _spec(x_info.sharding, nd)]
    ws = [_name(e) for e in _spec(w_info.sharding, 2)]
    os_ = [_name(e) for e in _spec(out_info.sharding, nd)]
    batch = xs[:nd - 2]
    seq_axis = nd - 2
    if ws[0] is not None and xs[-1] == ws[0]:  # row parallel: contraction sharded over a
        a = ws[0]
        batch = [b if b != a else None for b in batch]
        if nd >= 2 and os_[seq_axis] == a and out_info.shape[seq_axis] % mesh.shape[a] == 0:
            return ("row_scatter", a, P(*batch, None, a), P(a, None), P(*batch, a, None))
        return ("row_all_reduce", a, P(*batch, None, a), P(a, None), P(*batch, None, None))
    a = ws[1]
    if a is not None:  # column parallel
        batch = [b if b != a else None for b in batch]
        if nd >= 2 and xs[seq_axis] == a:
            return ("column_gather", a, P(*batch, a, None), P(None, a), P(*batch, None, a))
        return ("local", None, P(*batch, None, None), P(None, a), P(*batch, None, a))
    seq = xs[seq_axis] if nd >= 2 and xs[seq_axis] not in batch else None
    return ("local", None, P(*batch, seq, None), P(None, None), P(*batch, seq, None))


def _dense_partition(mesh, arg_infos, out_info):
    x_info, w_info = arg_infos
    mode, a, x_spec, w_spec, out_spec = _layout(mesh, x_info, w_info, out_info)
    seq_axis = len(x_info.shape) - 2

    def lower(x, w):
        if mode == "column_gather":
            return fused.all_gather_matmul(x, w, a, gather_axis=seq_axis)
        if mode == "row_scatter":
            return fused.matmul_reduce_scatter(x, w, a, scatter_axis=seq_axis)
        if mode == "row_all_reduce":
            return fused.matmul_all_reduce(x, w, a)
        return x @ w

    return (mesh, lower, NamedSharding(mesh, out_spec),
            (NamedSharding(mesh, x_spec), NamedSharding(mesh, w_spec)))


@custom_partitioning
def _dense(x, w):
    return x @ w


_dense.def_partition(partition=_dense_partition,
                     infer_sharding_from_operands=lambda mesh, args, out: NamedSharding(
                         mesh, _layout(mesh, args[0], args[1], out)[4]),
                     sharding_rule="... s h, h f -> ... t f")


def _weight_grad_partition(mesh, arg_infos, out_info):
    """dw[h, f] = sum over leading dims of x[..., h] dy[..., f]: gather whichever of x, dy is sequence-sharded
    over an axis the other is not, contract locally, and sum over the axes that shard the leading dims."""
    x_info, dy_info = arg_infos
    nd = len(x_info.shape)
    xs = [_name(e) for e in _spec(x_info.sharding, nd)]
    ds = [_name(e) for e in _spec(dy_info.sharding, nd)]
    h_axis, f_axis = xs[-1], ds[-1]
    if h_axis == f_axis:
        f_axis = None
    # leading dims: keep the sharding both agree on (summed after the product); gather the rest.
    lead = [a if a == b and a not in (h_axis, f_axis) else None for a, b in zip(xs[:-1], ds[:-1])]
    gather_x = [i for i in range(nd - 1) if xs[i] is not None and xs[i] != lead[i]]
    gather_dy = [i for i in range(nd - 1) if ds[i] is not None and ds[i] != lead[i]]
    summed = tuple(a for a in lead if a is not None)
    x_spec = P(*[xs[i] if (lead[i] is not None or i in gather_x) else None for i in range(nd - 1)], h_axis)
    dy_spec = P(*[ds[i] if (lead[i] is not None or i in gather_dy) else None for i in range(nd - 1)], f_axis)

    def lower(x, dy):
        for i in gather_x:
            x = comm.all_gather(x, xs[i], i)
        for i in gather_dy:
            dy = comm.all_gather(dy, ds[i], i)
        lead_dims = tuple(range(nd - 1))
        dw = lax.dot_general(x, dy, ((lead_dims, lead_dims), ((), ())),
                             preferred_element_type=jnp.float32).astype(x.dtype)
        if summed:
            dw = comm.all_reduce(dw, summed if len(summed) > 1 else summed[0])
        return dw

    return (mesh, lower, NamedSharding(mesh, P(h_axis, f_axis)),
            (NamedSharding(mesh, x_spec), NamedSharding(mesh, dy_spec)))


@custom_partitioning
def _weight_grad(x, dy):
    lead = tuple(range(x.ndim - 1))
    return lax.dot_general(x, dy, ((lead, lead), ((), ())))


_weight_grad.def_partition(partition=_weight_grad_partition,
                           infer_sharding_from_operands=lambda mesh, args, out: NamedSharding(
                               mesh, P(_name(_spec(args[0].sharding, len(args[0].shape))[-1]),
                                       _name(_spec(args[1].sharding, len(args[1].shape))[-1]))),
                           sharding_rule="... h, ... f -> h f")


@jax.custom_vjp
def dense(x, w):
    """`x @ w` (x: (..., S, H), w: (H, F)) partitioned onto jaxcoll's fused ops under `jax.jit` with shardings.

    The layout is read from the shardings XLA's propagation gives the operands and the result (see the module
    docstring); constrain the result with `jax.lax.with_sharding_constraint` to choose the row-parallel
    reduce-scatter (sequence-sharded result) over the all-reduce. Differentiable: the backward pass is two
    more partitioned products.
    """
    fused.collective_matmul.check_matmul_operands("jaxcoll.nn.dense", x, w)
    return _dense(x, w)


def _dense_fwd(x, w):
    return dense(x, w), (x, w)


def _dense_bwd(res, dy):
    x, w = res
    return _dense(dy, w.T), _weight_grad(x, dy)


dense.defvjp(_dense_fwd, _dense_bwd)
