"""Two-step all-to-all over `groups` groups of `size` ranks: first every rank gathers, in scratch, the blocks
bound for the group-mates of its peer in each other group and sends them across in one transfer per group
(few large messages over the slow links); then each rank scatters what arrived inside its group.

    python examples/lang/two_step_all_to_all.py 2 2
"""

import sys

from jaxcoll.lang import chunk, program


def two_step_all_to_all(groups: int, size: int):
    n = groups * size
    rank = lambda g, l: g * size + l  # noqa: E731
    with program("two_step_all_to_all", "all_to_all", n) as p:
        for g in range(groups):
            for l in range(size):
                me = rank(g, l)
                for h in range(groups):
                    # step 1: blocks for group h, staged contiguously, sent to the rank of group h with my index
                    if h == g:
                        continue
                    for m in range(size):
                        chunk(me, "input", rank(h, m)).copy(me, f"out{h}", m)
                    chunk(me, f"out{h}", 0, size).copy(rank(h, l), f"in{g}", 0)
        for g in range(groups):
            for l in range(size):
                me = rank(g, l)
                for m in range(size):  # my own group: direct
                    chunk(me, "input", rank(g, m)).copy(rank(g, m), "output", me)
                for h in range(groups):  # step 2: what rank (h, l) sent me, for each of my group-mates
                    if h != g:
                        for m in range(size):
                            chunk(me, f"in{h}", m).copy(rank(g, m), "output", rank(h, l))
    return p.plan()


if __name__ == "__main__":
    a = [int(x) for x in sys.argv[1:3]] or [2, 2]
    print(two_step_all_to_all(*a))
