"""Ring all-reduce in the collective language: reduce-scatter around the ring, then all-gather.

Chunk c starts on rank c+1, picks up every rank's contribution hop by hop in a scratch buffer "acc", ends fully
reduced on rank c, and is then copied around the ring into every output. The compiler fuses each hop's
reduction with the forward to the next rank (read_reduce_put) and inserts the signals and waits.

    python examples/lang/ring_all_reduce.py 4
"""

import sys

from jaxcoll.lang import chunk, program


def ring_all_reduce(n: int, instances: int = 1, pipeline: int = 1):
    with program("ring_all_reduce", "all_reduce", n, chunks=n, instances=instances, pipeline=pipeline) as p:
        for c in range(n):
            cur = chunk((c + 1) % n, "input", c)
            for hop in range(1, n):
                r = (c + 1 + hop) % n
                cur = cur.copy(r, "acc", c).reduce(chunk(r, "input", c))
            cur = cur.copy(c, "output", c)
            for hop in range(1, n):
                cur = cur.copy((c + hop) % n, "output", c)
    return p.plan()


if __name__ == "__main__":
    print(ring_all_reduce(int(sys.argv[1]) if len(sys.argv) > 1 else 4))
