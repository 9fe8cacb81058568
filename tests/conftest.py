"""Shared test setup: every test runs on 8 CPU devices (set before any computation touches the backend), and
hypothesis is tuned for a 2-core machine where eight device threads share the cores.

Profiles: "default" (quick), "ci" (more examples), "thorough" (nightly); pick one with HYPOTHESIS_PROFILE.
"""

import os

import jax

jax.config.update("jax_num_cpu_devices", 8)
# A tuning file in the user's cache (`jaxcoll tune` on this machine) would make "auto" run other plans than the
# model's: tests see the model alone unless they point JAXCOLL_TUNING at a file of their own.
os.environ.setdefault("JAXCOLL_TUNING", "off")

from hypothesis import HealthCheck, settings  # noqa: E402 - after the device count, before any test imports

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                   HealthCheck.function_scoped_fixture],
               print_blob=True)
settings.register_profile("default", max_examples=25, **_common)
settings.register_profile("ci", max_examples=60, **_common)
settings.register_profile("thorough", max_examples=400, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
