"""Synthesizers: plans built for a topology, and the bound they are measured against."""

from jaxcoll.synth.bound import lower_bound, min_cut_ratio

__all__ = ["lower_bound", "min_cut_ratio"]
