"""Tree plans: NCCL's double binary tree, and plain binary trees.

NCCL's tree all_reduce (Sanders et al.'s two-tree algorithm as NCCL builds it) chains the ranks of each box and
joins the boxes by a binary tree; a second tree, mirrored, carries the other half of the data so that a box that
is a leaf of one tree is inside the other. Chunks are reduced up to the root and broadcast back, pipelined: the
buffer is cut into `pipeline` chunks per tree.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxcoll.plan import Collective, Plan
from jaxcoll.synth.ring import ring_order
from jaxcoll.synth.trees import TreeRoute, tree_plan
from jaxcoll.topology import Topology


def binary_tree(order: Sequence[int], nranks: int) -> tuple[int, ...]:
    """Parent pointers of the in-order balanced binary tree over `order` (its middle is the root)."""
    parent = [-1] * nranks

    def build(lo: int, hi: int, up: int) -> None:
        if lo >= hi:
            return
        mid = (lo + hi) // 2
        parent[order[mid]] = up
        build(lo, mid, order[mid])
        build(mid + 1, hi, order[mid])

    build(0, len(order), -1)
    return tuple(parent)


def _root(parent: Sequence[int]) -> int:
    return next(v for v, p in enumerate(parent) if p < 0)


def nccl_trees(topology: Topology) -> list[tuple[int, ...]]:
    """The two trees of NCCL's double binary tree: a chain inside each box from its head, heads joined by a
    binary tree over the boxes; the second tree mirrors the box order and starts each chain at its other end."""
    n = topology.nranks
    order = ring_order(topology)
    per_box = [[v for v in order if topology.box_of(v) == b] for b in range(len(topology.boxes))]
    trees = []
    for mirror in (False, True):
        chains = [c[::-1] if mirror else c for c in per_box]
        boxes = list(range(len(chains)))[::-1] if mirror else list(range(len(chains)))
        heads = binary_tree([chains[b][0] for b in boxes], n)
        parent = list(heads)
        for c in chains:
            for a, b in zip(c, c[1:]):
                parent[b] = a
        trees.append(tuple(parent))
    return trees


def tree(topology: Topology, collective=Collective.ALL_REDUCE, pipeline: int = 1,
         trees: Sequence[Sequence[int]] | None = None) -> Plan:
    """All_reduce over the given trees (default: `nccl_trees`), each carrying `pipeline` chunks of the buffer."""
    collective = Collective(collective)
    if collective is not Collective.ALL_REDUCE:
        raise ValueError(f"tree covers all_reduce, got {collective.value!r}")
    trees = nccl_trees(topology) if trees is None else [tuple(t) for t in trees]
    k = pipeline * len(trees)
    routes = []
    for c in range(k):
        t = trees[c % len(trees)]
        routes.append(TreeRoute(_root(t), c, c, reduce_parent=t, bcast_parent=t, wave=c // len(trees)))
    return tree_plan(collective, topology.nranks, k, routes, name=f"tree{len(trees)}x{pipeline}")
