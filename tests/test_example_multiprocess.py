"""examples/train_multiprocess.py, shortened: data-parallel + tensor-parallel training across the processes of
a jax.distributed job (jaxcoll.launch) trains to the losses of the same training in one process, of jax.lax's
collectives (XLA's gloo) in the same processes, and of the unsharded model with no collective at all."""

import importlib.util
import pathlib

import numpy as np
import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "train_multiprocess.py"
STEPS = 25
MESH = (2, 4)  # data x model


def load():
    spec = importlib.util.spec_from_file_location("train_multiprocess", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ex():
    return load()


@pytest.fixture(scope="module")
def single_process(ex):
    """The same training in one process of 8 devices, on the same 2x4 mesh."""
    return ex.run_job(1, MESH, ["jaxcoll"], STEPS, timeout_s=240)["jaxcoll"]


@pytest.fixture(scope="module")
def unsharded(ex):
    """The reference no collective touches: the whole model and batch on one device, in this process."""
    return ex.train_unsharded(STEPS)


# 2 processes x 4 devices: "data" crosses the processes, "model" stays inside each; 4 x 2: both cross.
@pytest.mark.parametrize("processes,crossing", [(2, ["data"]), (4, ["data", "model"])])
def test_training_across_processes_has_the_single_process_losses(ex, single_process, unsharded, processes,
                                                                 crossing):
    runs = ex.run_job(processes, MESH, ["jaxcoll", "lax"], STEPS, timeout_s=240)  # checks every process agrees
    ours, lax = runs["jaxcoll"], runs["lax"]
    assert ours["processes"] == processes and ours["crossing"] == crossing, ours
    np.testing.assert_allclose(ours["losses"], single_process["losses"], rtol=ex.RTOL)
    np.testing.assert_allclose(ours["losses"], lax["losses"], rtol=ex.RTOL)
    np.testing.assert_allclose(ours["losses"], unsharded, rtol=ex.RTOL)
    assert ours["losses"][-1] < 0.5 * ours["losses"][0], ours["losses"]
    # Every collective of the step is jaxcoll's (the same count of XLA's is found in the jax.lax step).
    assert ours["xla_collectives"] == 0 and ours["jaxcoll_calls"] > 0, ours
    assert lax["xla_collectives"] > 0 and lax["jaxcoll_calls"] == 0, lax
