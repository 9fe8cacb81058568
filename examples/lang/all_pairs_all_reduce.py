"""All-pairs all-reduce: rank r owns chunk r; every rank sends it its piece, r reduces them and sends the result
back to everyone. Two hops per chunk whatever the group size: the low-latency choice on a fully connected node.

    python examples/lang/all_pairs_all_reduce.py 4
"""

import sys

from jaxcoll.lang import chunk, program


def all_pairs_all_reduce(n: int, instances: int = 1):
    with program("all_pairs_all_reduce", "all_reduce", n, chunks=n, instances=instances) as p:
        for r in range(n):  # reduce-scatter: every peer's chunk r goes to rank r's scratch slot for that peer
            for peer in range(n):
                if peer != r:
                    chunk(peer, "input", r).copy(r, f"from{peer}", r)
        for r in range(n):
            acc = chunk(r, "input", r).copy(r, "output", r)
            for peer in range(n):
                if peer != r:
                    acc.reduce(chunk(r, f"from{peer}", r))
            for peer in range(n):  # all-gather: the reduced chunk to every peer's output
                if peer != r:
                    acc.copy(peer, "output", r)
    return p.plan()


if __name__ == "__main__":
    print(all_pairs_all_reduce(int(sys.argv[1]) if len(sys.argv) > 1 else 4))
