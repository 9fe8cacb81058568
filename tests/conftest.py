"""Every test runs on 8 CPU devices (set before any computation touches the backend)."""

import jax

jax.config.update("jax_num_cpu_devices", 8)
