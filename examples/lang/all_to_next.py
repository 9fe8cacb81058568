"""All-to-next, a custom collective (from MSCCLang): rank r sends its whole input to rank r+1; the last rank
sends nothing and the first receives nothing. Across `groups` groups of `size` ranks the transfer between
groups is split over all ranks of both groups so every link between them carries a share.

A custom collective states its postcondition: output chunk i of rank r holds rank r-1's input chunk i, and rank
0's output is unconstrained. The compiled plan carries it (`Plan.expect`), so a saved plan is proved from its
file alone (`jaxcoll plan check all_to_next.json`).

    python examples/lang/all_to_next.py 2 2
"""

import sys

from jaxcoll.lang import chunk, program
from jaxcoll.lang.postcondition import value


def all_to_next(groups: int, size: int):
    n = groups * size
    rank = lambda g, l: g * size + l  # noqa: E731

    def post(r, i):
        return None if r == 0 else value([(r - 1, i)])

    with program("all_to_next", "custom", n, chunks=size, in_blocks=1, out_blocks=1, postcondition=post) as p:
        for g in range(groups):
            for l in range(size):
                me = rank(g, l)
                if me == n - 1:
                    continue
                if l < size - 1:  # next rank is in my group: direct
                    chunk(me, "input", 0, size).copy(me + 1, "output", 0)
                    continue
                # last rank of a group: scatter my chunks over my group, each group-mate crosses to its peer
                # in the next group, which forwards to the next group's first rank
                for c in range(size):
                    via = chunk(me, "input", c).copy(rank(g, c), "stage", c)
                    across = via.copy(rank(g + 1, c), "stage", c)
                    across.copy(rank(g + 1, 0), "output", c)
    return p.plan()


if __name__ == "__main__":
    a = [int(x) for x in sys.argv[1:3]] or [2, 2]
    print(all_to_next(*a))
