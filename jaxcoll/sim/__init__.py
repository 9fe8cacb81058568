"""The cost-model simulator: how long a plan takes on a topology (alpha-beta per transfer, fair link sharing)."""

from jaxcoll.sim.engine import SimulationError, chunk_bytes, simulate

__all__ = ["SimulationError", "chunk_bytes", "simulate"]
