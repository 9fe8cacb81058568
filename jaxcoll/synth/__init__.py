"""Synthesizers: plans built for a topology, and the bound they are measured against.

`synthesize(topology, collective, nbytes)` returns the plan with the best simulated time among the classic
parametric plans (ring, double binary tree, recursive halving/doubling, hierarchical, direct) and the spanning-tree
packing; `lower_bound(topology, collective, nbytes)` is the time no plan beats.
"""

from jaxcoll.synth.bound import lower_bound, min_cut_ratio
from jaxcoll.synth.direct import direct
from jaxcoll.synth.hierarchical import hierarchical
from jaxcoll.synth.packing import Packing, forest, pack_trees
from jaxcoll.synth.rhd import rhd
from jaxcoll.synth.ring import ring, ring_order
from jaxcoll.synth.select import candidates, evaluate, synthesize
from jaxcoll.synth.tree import tree
from jaxcoll.synth.trees import TreeRoute, tree_plan

__all__ = ["Packing", "TreeRoute", "candidates", "direct", "evaluate", "forest", "hierarchical", "lower_bound",
           "min_cut_ratio", "pack_trees", "rhd", "ring", "ring_order", "synthesize", "tree", "tree_plan"]
