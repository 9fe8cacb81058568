"""Choosing the fastest plan on the machine at hand: a measured cost model, a tuner, and the choice "auto" makes.

- `calibrate()` measures the running job's links (copies inside a process, shared segments between processes,
  the network between hosts) with short microbenchmarks and returns the model (`jaxcoll.sim.machine.MachineModel`).
- `predict(collective, nbytes=, nranks=, algorithm=)` prices one call of any built-in, synthesized or registered
  plan with the model.
- `register(plan)` adds a user's plan to what auto chooses among.
- `jaxcoll tune` (`jaxcoll.tune.run`) measures the leading candidates of each cell and writes the tuning file
  (`jaxcoll.tune.file`) that auto then follows, with the model fitted again to every call the run measured, which
  prices what the run did not measure.

docs/tuning.md has the model, the calibration, its validation against measurement, and how to tune a job.
"""

from jaxcoll.sim.machine import MachineModel
from jaxcoll.tune.registry import TUNED, candidates, register, registered, unregister
from jaxcoll.tune.choice import choose, model
from jaxcoll.tune.file import TuningFileWarning
from jaxcoll.tune.predict import predict


def calibrate(*args, **kwargs) -> MachineModel:
    """`jaxcoll.tune.calibration.calibrate`: this job's MachineModel, measured (imports JAX's runtime when called)."""
    from jaxcoll.tune.calibration import calibrate as run_probes
    return run_probes(*args, **kwargs)


__all__ = ["TUNED", "MachineModel", "TuningFileWarning", "calibrate", "candidates", "choose", "model", "predict",
           "register", "registered", "unregister"]
