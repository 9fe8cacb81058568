"""Draw a topology to an image: ranks as circles by box, switches as squares, links with their bandwidth."""

from __future__ import annotations

import math

from jaxcoll.topology.graph import Topology


def _layout(t: Topology) -> dict[int, tuple[float, float]]:
    pos = {}
    nb = len(t.boxes)
    for b, box in enumerate(t.boxes):
        cx = (b - (nb - 1) / 2) * 3.0
        for i, r in enumerate(box):
            a = 2 * math.pi * i / len(box)
            pos[r] = (cx + math.cos(a), math.sin(a))
    switches = list(range(t.nranks, t.num_nodes))
    for i, s in enumerate(switches):
        name = t.node_name(s)
        if name.startswith("b") and "." in name:
            b = int(name[1:name.index(".")])
            cx = (b - (nb - 1) / 2) * 3.0
            members = [k for k in switches if t.node_name(k).startswith(f"b{b}.")]
            j = members.index(s)
            pos[s] = (cx + 0.35 * (j - (len(members) - 1) / 2) / max(1, len(members)) * 4, -1.8 - 0.3 * (j % 2))
        else:
            others = [k for k in switches if not ("." in t.node_name(k) and t.node_name(k).startswith("b"))]
            j = others.index(s)
            pos[s] = ((j - (len(others) - 1) / 2) * 0.8, 2.6)
    return pos


def draw(t: Topology, path: str) -> None:
    """Write a PNG of the topology to `path` (matplotlib, no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = _layout(t)
    fig, ax = plt.subplots(figsize=(4 + 3 * len(t.boxes), 6))
    width = max(l.bandwidth_GBps for l in t.links)
    for l in t.links:
        if l.src > l.dst and t.capacity(l.dst, l.src):
            continue  # draw a duplex pair once
        (x0, y0), (x1, y1) = pos[l.src], pos[l.dst]
        ax.plot([x0, x1], [y0, y1], color="tab:blue", alpha=0.5, lw=0.5 + 3 * l.bandwidth_GBps / width, zorder=1)
    for v, (x, y) in pos.items():
        if t.is_rank(v):
            ax.scatter([x], [y], s=300, color="tab:green", zorder=2)
            ax.text(x, y, str(v), ha="center", va="center", fontsize=8, zorder=3)
        else:
            ax.scatter([x], [y], s=120, marker="s", color="tab:gray", zorder=2)
            ax.text(x, y + 0.12, t.node_name(v), ha="center", fontsize=6, zorder=3)
    ax.set_title(f"{t.name}: {t.nranks} ranks (line width ~ bandwidth, widest {width:g} GB/s)")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
