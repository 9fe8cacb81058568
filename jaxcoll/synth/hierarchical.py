"""Hierarchical plans for multi-box topologies: reduce_scatter inside each box, all_reduce across boxes among
the ranks at the same position (one rail each), all_gather inside each box.

Chunk (g, b) of the buffer is reduced along the box ring to position g of every box, then along the chain of
boxes to position g of box b (its root), then broadcast back the same way. all_gather and reduce_scatter use the
halves: across boxes first, then inside (all_gather), and the reverse (reduce_scatter). Boxes must be of equal size.
"""

from __future__ import annotations

from jaxcoll.plan import Collective, Plan
from jaxcoll.synth.ring import ring_order
from jaxcoll.synth.trees import TreeRoute, tree_plan
from jaxcoll.topology import Topology


def hierarchical(topology: Topology, collective, pipeline: int = 1) -> Plan:
    collective = Collective(collective)
    n, nb = topology.nranks, len(topology.boxes)
    order = ring_order(topology)
    boxes = [[v for v in order if topology.box_of(v) == b] for b in range(nb)]
    g_size = len(boxes[0])
    if any(len(b) != g_size for b in boxes):
        raise ValueError("hierarchical plans need boxes of equal size")
    routes = []
    for q in range(pipeline):
        for b_root in range(nb):
            for g in range(g_size):
                root = boxes[b_root][g]
                up = [-1] * n  # in-tree: intra-box chain to position g, then box chain to b_root
                down = [-1] * n
                for b in range(nb):
                    box = boxes[b]
                    inward = [box[(g + 1 + t) % g_size] for t in range(g_size)]  # ends at position g
                    for a, c in zip(inward, inward[1:]):
                        up[a] = c
                    outward = [box[(g + t) % g_size] for t in range(g_size)]
                    for a, c in zip(outward, outward[1:]):
                        down[c] = a
                box_in = [(b_root + 1 + t) % nb for t in range(nb)]
                for a, c in zip(box_in, box_in[1:]):
                    up[boxes[a][g]] = boxes[c][g]
                box_out = [(b_root + t) % nb for t in range(nb)]
                for a, c in zip(box_out, box_out[1:]):
                    down[boxes[c][g]] = boxes[a][g]
                item = (q * nb + b_root) * g_size + g
                if collective is Collective.ALL_REDUCE:
                    routes.append(TreeRoute(root, item, item, reduce_parent=tuple(up), bcast_parent=tuple(down),
                                            wave=q))
                elif collective is Collective.ALL_GATHER:
                    routes.append(TreeRoute(root, q, root * pipeline + q, bcast_parent=tuple(down), wave=q))
                elif collective is Collective.REDUCE_SCATTER:
                    routes.append(TreeRoute(root, root * pipeline + q, q, reduce_parent=tuple(up), wave=q))
                else:
                    raise ValueError(f"hierarchical covers all_gather, reduce_scatter and all_reduce, "
                                     f"got {collective.value!r}")
    k = pipeline * n if collective is Collective.ALL_REDUCE else pipeline
    return tree_plan(collective, n, k, routes, name=f"hierarchical{pipeline}")
