"""Topologies: the graphs of ranks, switches and links that plans are synthesized for and simulated on."""

from jaxcoll.topology.errors import TopologyError
from jaxcoll.topology.graph import Link, Topology
from jaxcoll.topology.job import job, layout
from jaxcoll.topology.nvidia_smi import parse_nvidia_smi_topo
from jaxcoll.topology.presets import PRESETS, cpu, preset

__all__ = ["Link", "PRESETS", "Topology", "TopologyError", "cpu", "job", "layout", "parse_nvidia_smi_topo", "preset"]
