"""Sparse all-reduce of the largest gradient entries, after Ok-Topk (Li and Hoefler, PPoPP 2022): selection by a
global threshold, a balanced sparse reduce-scatter, an all-gather of the result, error feedback; O(k) traffic.

Per rank, on its flat float32 vector x of L elements (N ranks, k slots):
1. Threshold: t is the ceil(k S / L)-th largest magnitude of S = min(L, 65536) entries of x: all of them, or
   1024 runs of 64 consecutive entries evenly spaced (run r from x[floor(r L / 1024)]); it is raised to
   `threshold` and to the least positive float (zeros are never selected); inf and NaN always reach it (so a
   sum shows them, as the dense one would). About k entries of x reach t; when L <= 65536 exactly the k largest
   magnitudes and their ties do. Ok-Topk, too, estimates its threshold rather than sorting.
2. Buckets: the index space is dealt to the N ranks in stripes of B = 16 elements (a cache line): stripe j is
   part of region j mod N, which rank j mod N owns, so a layer whose gradients outweigh the rest spreads over
   every owner (Ok-Topk balances its regions by moving their boundaries, which needs the ranks to agree first).
   A region has R = ceil(L / (B N)) B positions. The entries that reach t go, in index order, into their region's
   bucket of `capacity` c = min(R, SLACK ceil(k / N)) (position, value) slots; an entry past a full bucket is
   not sent. Every bucket has the same size: a balanced exchange.
3. Hop 1 (jaxcoll all_to_all): bucket p goes to rank p, which sums its N buckets per index in float32, in rank
   order, and keeps the `kept` c' = min(R, ceil(k / N)) sums of largest magnitude (NaN first, ties to the lower
   index): Ok-Topk's second, global selection, so about k entries are in the result.
4. Hop 2 (jaxcoll all_gather): every rank gets every owner's kept bucket and writes the dense result.

The result is exactly the dense all-reduce of the entries that were sent and kept: rank r's entry counts when
it was in its bucket and the owner kept its index. Those entries leave rank r's `residual` (x with them zeroed);
entries below t, past a full bucket, or dropped by the owner stay, for error feedback: add the residual to the
next step's x. Traffic per rank: 8 bytes a slot, (N - 1)(c + c') slots, about 24 (N-1)/N k bytes at SLACK 2,
against 8 (N-1)/N L for the dense float32 all-reduce: L/(3k) times less (33x at k = L/100).

The four local stages run as jaxcoll's C++ kernels on XLA:CPU (csrc/topk.hpp through `jax.ffi.ffi_call`): one
read of x to select, the owner's merge of the O(k) received slots, one write of the dense result, and a copy of
x for the residual (left out by XLA when the residual is unused). On other platforms (`lax.platform_dependent`)
the same stages run in jax.numpy with the same results: a cumulative sum compacts the buckets, scatters do the
rest. That path is why the kernels exist: on XLA:CPU such a compaction took 1.36 s for 16M elements a rank (8
ranks on 2 cores), 20x the dense all-reduce.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcoll import _jax, exact
from jaxcoll.lowering import groups
from jaxcoll.plan import abi


@dataclasses.dataclass(frozen=True)
class TopK:
    """Sparse compression: each rank selects about `k` of its entries (or `fraction` of them), each at least
    `threshold` in magnitude (None: no floor), and about k of their sums are kept in all (the module docstring
    says how). Pass as `compression=` to jaxcoll.all_reduce, or to `topk_all_reduce`."""

    k: int | None = None
    fraction: float | None = None
    threshold: float | None = None
    name = "topk"

    def __post_init__(self):
        if (self.k is None) == (self.fraction is None):
            raise ValueError(f"TopK: give exactly one of k and fraction, got k={self.k!r}, "
                             f"fraction={self.fraction!r}")
        if self.fraction is not None and not (isinstance(self.fraction, (float, int)) and 0 < self.fraction <= 1):
            raise ValueError(f"TopK: fraction={self.fraction!r} is out of range; it must be in (0, 1]")
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer))):
            raise ValueError(f"TopK: k={self.k!r} must be an integer")
        if self.threshold is not None and not (isinstance(self.threshold, (float, int, np.floating, np.integer))
                                               and not isinstance(self.threshold, bool) and self.threshold >= 0):
            raise ValueError(f"TopK: threshold={self.threshold!r} must be None or a number >= 0")

    def slots(self, api_name: str, elements: int) -> int:
        """k for a leaf of `elements` elements; ValueError naming k when it is out of [1, elements]."""
        k = int(self.k) if self.k is not None else max(1, int(round(self.fraction * elements)))
        if not 1 <= k <= elements:
            raise ValueError(f"{api_name}: k={k} is out of range for x of {elements} elements; it must be in "
                             f"[1, {elements}]")
        return k


# Hop 1's bucket capacity over the balanced share ceil(k/N): room for a region that holds up to twice its share of
# the selected entries (gradients are rarely spread evenly over the index space) at 1.5x the traffic of none.
SLACK = 2

# The threshold's sample size and run, and the regions' stripe (csrc/topk.hpp's kTopkSample, kTopkSampleRun and
# kTopkStripe; the native module reports them and tests/test_abi.py holds the two together).
SAMPLE = 1 << 16
SAMPLE_RUN = 64
STRIPE = 16

NO_ENTRY = -1  # a bucket's unused slot (csrc/topk.hpp's kNoEntry)


@dataclasses.dataclass(frozen=True)
class Layout:
    """A rank's L `elements` dealt to `nranks` regions of `region` positions, and the buckets' slots for `k`:
    `capacity` per region a rank sends (hop 1), `kept` per owner (hop 2)."""

    elements: int
    k: int
    nranks: int

    @classmethod
    def of(cls, elements: int, k: int, nranks: int) -> "Layout":
        return cls(elements, k, nranks)

    @property
    def region(self) -> int:
        return -(-self.elements // (STRIPE * self.nranks)) * STRIPE

    @property
    def capacity(self) -> int:
        return min(self.region, SLACK * -(-self.k // self.nranks))

    @property
    def kept(self) -> int:
        return min(self.region, -(-self.k // self.nranks))

    def wire_bytes(self) -> int:
        """Bytes one rank sends to the others for one call: N - 1 buckets of hop 1, its kept bucket to N - 1."""
        return 8 * (self.nranks - 1) * (self.capacity + self.kept)


def _magnitude_bits(v):
    """|v|'s float32 bits as int32: they order as the magnitudes do, NaN above inf."""
    return lax.bitcast_convert_type(v, jnp.int32) & 0x7FFFFFFF


_INF_BITS = 0x7F800000


# -- The local stages in jax.numpy (platforms without the kernels); each matches csrc/topk.hpp bit for bit --------

def _select_jnp(x, layout: Layout, threshold):
    n, r, c = layout.nranks, layout.region, layout.capacity
    sample = np.arange(x.size)
    if x.size > SAMPLE:  # SAMPLE / SAMPLE_RUN runs of SAMPLE_RUN consecutive elements, evenly spaced
        runs = SAMPLE // SAMPLE_RUN
        sample = (np.arange(runs, dtype=np.int64)[:, None] * x.size // runs + np.arange(SAMPLE_RUN)).reshape(-1)
    rank = -(-layout.k * sample.size // x.size)
    t = lax.top_k(_magnitude_bits(x[sample]), rank)[0][rank - 1]
    floor = int(np.float32(threshold or 0).view(np.int32))
    t = jnp.minimum(jnp.maximum(t, max(1, floor)), _INF_BITS)
    # (stripes / N, N, B) -> (N, stripes / N, B): row p is region p, in position order.
    rows = jnp.pad(x, (0, n * r - x.size)).reshape(r // STRIPE, n, STRIPE).transpose(1, 0, 2).reshape(n, r)
    chosen = _magnitude_bits(rows) >= t
    slot = jnp.cumsum(chosen, axis=1, dtype=jnp.int32) - 1
    slot = jnp.where(chosen & (slot < c), slot, c)  # column c: not sent, sliced off below
    row = lax.broadcasted_iota(jnp.int32, (n, r), 0)
    positions = jnp.full((n, c + 1), NO_ENTRY, jnp.int32).at[row, slot].set(
        lax.broadcasted_iota(jnp.int32, (n, r), 1))[:, :c]
    values = jnp.zeros((n, c + 1), jnp.int32).at[row, slot].set(lax.bitcast_convert_type(rows, jnp.int32))[:, :c]
    return jnp.stack([positions, values], axis=1).reshape(-1)


def _reduce_jnp(received, layout: Layout):
    n, r, kept = layout.nranks, layout.region, layout.kept
    buckets = received.reshape(n, 2, -1)
    total = jnp.zeros(r, jnp.float32)
    touched = jnp.zeros(r, jnp.bool_)
    for p in range(n):  # one scatter per rank: the sums run in rank order
        index = jnp.where(buckets[p, 0] >= 0, buckets[p, 0], r)
        total = total.at[index].add(lax.bitcast_convert_type(buckets[p, 1], jnp.float32), mode="drop")
        touched = touched.at[index].set(True, mode="drop")
    key = jnp.where(touched, _magnitude_bits(total), -1)
    top = lax.top_k(key, kept)[1]  # equal keys: the lower index first
    position = jnp.sort(jnp.where(key[top] >= 0, top, r))
    used = position < r
    value = jnp.where(used, lax.bitcast_convert_type(total[jnp.minimum(position, r - 1)], jnp.int32), 0)
    return jnp.concatenate([jnp.where(used, position, NO_ENTRY), value])


def _global_index(buckets, layout: Layout):
    """Buckets (flat, N of them) as the indices of their entries in x (L where a slot is unused) and values."""
    b = buckets.reshape(layout.nranks, 2, -1)
    region = lax.broadcasted_iota(jnp.int32, b[:, 0].shape, 0)
    index = (b[:, 0] // STRIPE * layout.nranks + region) * STRIPE + b[:, 0] % STRIPE
    return jnp.where(b[:, 0] >= 0, index, layout.elements).reshape(-1), b[:, 1].reshape(-1)


def _result_jnp(gathered, layout: Layout):
    index, value = _global_index(gathered, layout)
    return jnp.zeros(layout.elements, jnp.float32).at[index].set(lax.bitcast_convert_type(value, jnp.float32),
                                                                  mode="drop")


def _residual_jnp(x, sent, gathered, layout: Layout):
    kept = jnp.zeros(layout.elements + 1, jnp.bool_).at[_global_index(gathered, layout)[0]].set(True)
    index = _global_index(sent, layout)[0]
    return x.at[jnp.where(kept[index], index, layout.elements)].set(np.float32(0), mode="drop")


# -- The same stages as jaxcoll's kernels (XLA:CPU) -------------------------------------------------------------

def _kernel(target: str, like, length: int, dtype, *args, **attributes):
    """The sparse kernel `target` (abi.SPARSE_TARGETS) on args: its one result of `length` elements, typed as
    `like` varies (ffi_call types its results from the declared ones under shard_map(check_vma=True))."""
    from jaxcoll import runtime  # here, not at the top: see codec._native
    runtime.register()
    call = jax.ffi.ffi_call(target, _jax.result_like(like, (length,), dtype),
                            vmap_method="broadcast_all")
    return call(*args, **{k: np.int64(v) if isinstance(v, int) else v for k, v in attributes.items()})


def _stage(kernels: bool | None, native, fallback, *args):
    """One local stage: the kernel on XLA:CPU and jax.numpy elsewhere (kernels=None), or the one named."""
    if kernels is None:
        return lax.platform_dependent(*args, cpu=native, default=fallback)
    return native(*args) if kernels else fallback(*args)


def _sparse_all_reduce(flat, axes: tuple, layout: Layout, threshold, kernels: bool | None = None):
    """(result, residual) for one rank's float32 vector `flat`; `kernels`: see _stage (tests pick the jnp path)."""
    n, c, kept, length = layout.nranks, layout.capacity, layout.kept, layout.elements
    floor = np.float32(threshold or 0)

    def select(v):
        return _kernel(abi.TOPK_SELECT_TARGET, v, n * 2 * c, jnp.int32, v, k=layout.k, nranks=n, threshold=floor)

    def reduce(v):
        return _kernel(abi.TOPK_REDUCE_TARGET, v, 2 * kept, jnp.int32, v, nranks=n, region=layout.region)

    def result(g):
        return _kernel(abi.TOPK_RESULT_TARGET, g, length, jnp.float32, g, nranks=n)

    def residual(v, s, g):
        return _kernel(abi.TOPK_RESIDUAL_TARGET, v, length, jnp.float32, v, s, g, nranks=n)

    sent = _stage(kernels, select, lambda v: _select_jnp(v, layout, threshold), flat)
    # Hop 1: bucket p goes to rank p; it receives the N ranks' buckets for its region, in rank order.
    received = exact.all_to_all(sent, axes, 0, 0, tiled=True)
    kept_bucket = _stage(kernels, reduce, lambda v: _reduce_jnp(v, layout), received)
    # Hop 2: every rank gathers every owner's kept bucket; the result is invariant, as psum's is.
    gathered = exact.all_gather(kept_bucket, axes, tiled=True, invariant=True)
    out = _stage(kernels, result, lambda g: _result_jnp(g, layout), gathered)
    # The residual varies like x, and an ffi_call's operands must vary alike: type the gathered buckets so.
    gathered = groups.pvary_missing(gathered, tuple(sorted(_jax.varying_axes(jax.typeof(flat)))))
    rest = _stage(kernels, residual, lambda v, s, g: _residual_jnp(v, s, g, layout), flat, sent, gathered)
    return out, rest


def check(api_name: str, topk: TopK, x) -> int:
    """k for leaf x; TypeError for a non-float x."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{api_name}: compression='topk' is lossy and needs a float operand, got "
                        f"dtype={np.dtype(x.dtype).name}")
    return topk.slots(api_name, x.size)


def topk_leaf(x, axes: tuple, topk: TopK, api_name: str, kernels: bool | None = None):
    """(result, residual) of one leaf, in x's dtype; differentiable as the exact sum (straight-through).
    kernels: None runs the local stages as jaxcoll's kernels on XLA:CPU and in jax.numpy elsewhere; True or
    False picks one everywhere (the tests hold both to the numpy reference on CPU)."""
    k = check(api_name, topk, x)
    layout = Layout.of(x.size, k, groups.group_size(axes))

    def compressed(v):
        result, residual = _sparse_all_reduce(v.astype(jnp.float32).reshape(-1), axes, layout, topk.threshold,
                                              kernels)
        return result.reshape(v.shape).astype(v.dtype), residual.reshape(v.shape).astype(v.dtype)

    f = jax.custom_jvp(compressed)
    # Straight-through: the whole tangent is summed exactly, so none of it stays in the residual.
    f.defjvp(lambda primals, tangents: (f(*primals), (exact.all_reduce(tangents[0], axes),
                                                      jnp.zeros_like(tangents[0]))))
    return f(x)


def topk_all_reduce(x, axis_name, topk: TopK | None = None, *, k=None, fraction=None, threshold=None):
    """Sparse all-reduce with error feedback: (result, residual) per leaf of x.

    Args:
      x: a float array or pytree of them (each leaf selected and summed on its own).
      axis_name: a mesh axis name of the enclosing `jax.shard_map`, or a tuple of them.
      topk: a `TopK`; or give k (slots per rank, in [1, x.size]), fraction (of x.size) and threshold here.

    Returns:
      (result, residual): result is the sum over the ranks of the entries each rank sent and the owner kept
      (about k in all; the module docstring says which), invariant over `axis_name` as psum's result is;
      residual is this rank's x with those entries zeroed, to add to the next step's x (error feedback).
      Traffic per rank: 8 bytes a slot, (N - 1)(capacity + kept) slots (`Layout`): O(k).
    """
    api = "jaxcoll.compress.topk_all_reduce"
    topk = topk if topk is not None else TopK(k=k, fraction=fraction, threshold=threshold)
    axes = groups.axis_names(axis_name, api)
    leaves, tree = jax.tree_util.tree_flatten(x)
    pairs = [topk_leaf(jnp.asarray(leaf), axes, topk, api) for leaf in leaves]
    return (jax.tree_util.tree_unflatten(tree, [p[0] for p in pairs]),
            jax.tree_util.tree_unflatten(tree, [p[1] for p in pairs]))
