"""How long a plan takes: on a topology of links (`simulate`: alpha-beta per transfer, fair link sharing; the
synthesizers and the GPU presets), and on a measured machine (`jaxcoll.sim.machine`: the executor's work priced
by calibrated constants; what "auto" chooses by on the CPU runtime)."""

from jaxcoll.sim.engine import SimulationError, chunk_bytes, simulate

__all__ = ["SimulationError", "chunk_bytes", "simulate"]
