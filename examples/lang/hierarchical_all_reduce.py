"""Hierarchical all-reduce over `groups` groups of `size` ranks (rank = group * size + local): reduce-scatter
inside each group, all-reduce of each scattered piece across the groups (a ring over the ranks that share a
local index), then all-gather inside each group. Only 1/size of the data crosses between groups.

    python examples/lang/hierarchical_all_reduce.py 2 4
"""

import sys

from jaxcoll.lang import chunk, program


def hierarchical_all_reduce(groups: int, size: int):
    n = groups * size
    rank = lambda g, l: g * size + l  # noqa: E731
    # chunk index = local owner * groups + group slice: local owner l reduces chunks l*groups .. l*groups+groups-1
    with program("hierarchical_all_reduce", "all_reduce", n, chunks=n) as p:
        for g in range(groups):  # 1. intra-group reduce-scatter (direct): local l collects its slice of chunks
            for l in range(size):
                for peer in range(size):
                    if peer != l:
                        chunk(rank(g, peer), "input", l * groups, groups).copy(rank(g, l), f"rs{peer}", l * groups)
                acc = chunk(rank(g, l), "input", l * groups, groups).copy(rank(g, l), "output", l * groups)
                for peer in range(size):
                    if peer != l:
                        acc.reduce(chunk(rank(g, l), f"rs{peer}", l * groups, groups))
        for l in range(size):  # 2. inter-group ring all-reduce of slice l among ranks with local index l
            for j in range(groups):
                c = l * groups + j
                cur = chunk(rank((j + 1) % groups, l), "output", c)
                for hop in range(1, groups):
                    g = (j + 1 + hop) % groups
                    cur = cur.copy(rank(g, l), "ring", c).reduce(chunk(rank(g, l), "output", c))
                    cur = cur.copy(rank(g, l), "output", c)
                for hop in range(1, groups):
                    cur = cur.copy(rank((j + hop) % groups, l), "output", c)
        for g in range(groups):  # 3. intra-group all-gather (direct)
            for l in range(size):
                for peer in range(size):
                    if peer != l:
                        chunk(rank(g, l), "output", l * groups, groups).copy(rank(g, peer), "output", l * groups)
    return p.plan()


if __name__ == "__main__":
    a = [int(x) for x in sys.argv[1:3]] or [2, 4]
    print(hierarchical_all_reduce(*a))
