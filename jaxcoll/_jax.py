"""Every use of private JAX in jaxcoll, each with the public API it stands in for and the versions checked."""

from __future__ import annotations


def distributed_client():
    """jax.distributed's key-value client, or None before jax.distributed.initialize(). No public API exposes
    it (jax.distributed has initialize/shutdown only). Checked on jax 0.10.2."""
    from jax._src import distributed
    return distributed.global_state.client


def coordinator_address() -> str | None:
    """The address jax.distributed.initialize was given for the coordinator (None before it). No public API
    exposes it. Checked on jax 0.10.2."""
    from jax._src import distributed
    return distributed.global_state.coordinator_address
