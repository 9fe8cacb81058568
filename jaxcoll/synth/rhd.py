"""Recursive halving and doubling (Thakur, Rabenseifner and Gropp): log2 N exchange steps with partners at
distance N/2, N/4, ... (reduce_scatter by halving) and back (all_gather by doubling); N must be a power of two.

Chunk c ends at rank c. In tree terms, rank v hands its partial of chunk c to v XOR h, h the highest bit in which
v and c differ: that is v's parent in c's binomial tree, for the halving and the doubling alike.
"""

from __future__ import annotations

from jaxcoll.plan import Plan
from jaxcoll.synth.trees import tree_per_root
from jaxcoll.topology import Topology


def binomial_parents(nranks: int, root: int) -> tuple[int, ...]:
    return tuple(-1 if v == root else v ^ (1 << ((v ^ root).bit_length() - 1)) for v in range(nranks))


def rhd(topology: Topology, collective) -> Plan:
    n = topology.nranks
    if n & (n - 1):
        raise ValueError(f"recursive halving/doubling needs a power-of-two group, got nranks={n}")
    return tree_per_root(collective, n, lambda c: binomial_parents(n, c), "rhd")
