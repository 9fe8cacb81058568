"""The custom call's interface is one table: the C++ side (csrc/abi.hpp, as compiled into the native module) says
what the Python side (jaxcoll.plan.abi) says, and the lowering writes what both say."""

import re

import numpy as np
import pytest

import jaxcoll
from jaxcoll import _jaxcoll, runtime
from jaxcoll.algorithms import direct
from jaxcoll.plan import Collective, abi, encode
from sharded import put, sharded


def test_reduce_op_codes_are_the_documented_ones():
    # docs/plan-ir.md, "The custom call": compiled programs carry these codes, so they never change.
    assert abi.REDUCE_OP_CODES == {"sum": 0, "max": 1, "min": 2}


def test_native_reduce_op_codes_are_the_python_table():
    assert dict(_jaxcoll.abi()["reduce_ops"]) == abi.REDUCE_OP_CODES


def test_native_targets_are_the_python_table():
    assert list(_jaxcoll.abi()["targets"]) == list(abi.TARGETS)
    assert abi.TARGETS == tuple("jaxcoll_" + c.value for c in Collective)


def test_native_network_target_is_the_python_one():
    assert _jaxcoll.abi()["network_target"] == abi.NETWORK_TARGET == "jaxcoll_network"


def test_native_sparse_targets_are_the_python_table():
    assert list(_jaxcoll.abi()["sparse_targets"]) == list(abi.SPARSE_TARGETS)
    assert set(_jaxcoll.sparse_registrations()) == set(abi.SPARSE_TARGETS)


def test_the_sparse_kernels_constants_are_the_jnp_stages():
    from jaxcoll.compress import sparse
    assert dict(_jaxcoll.abi()["topk"]) == {"sample": sparse.SAMPLE, "sample_run": sparse.SAMPLE_RUN,
                                            "stripe": sparse.STRIPE, "no_entry": sparse.NO_ENTRY}


def test_native_codec_targets_are_the_python_ones():
    assert list(_jaxcoll.abi()["codec_targets"]) == list(abi.CODEC_TARGETS)
    assert abi.CODEC_TARGETS == tuple("jaxcoll_codec_" + op for op in
                                      ("encode", "decode", "decode_sum", "decode_sum_encode", "encode_wire",
                                       "decode_sum_wire", "decode_sum_encode_wire", "decode_wire"))


def test_the_codec_targets_are_registered_for_cpu():
    # Stateless handlers, CPU only: other platforms run the jax.numpy formats (jaxcoll.compress.codec).
    assert set(_jaxcoll.codec_registrations()) == set(abi.CODEC_TARGETS)


def test_every_target_is_registered_for_each_platform():
    assert set(_jaxcoll.registrations()) == set(abi.TARGETS)
    if _jaxcoll.with_cuda:  # the network steps exist on XLA's CUDA platform only
        assert set(_jaxcoll.cuda_registrations()) == set(abi.TARGETS) | {abi.NETWORK_TARGET}


@pytest.mark.parametrize("code", [-1, len(abi.REDUCE_OP_CODES)])
@pytest.mark.parametrize("executor", ["cpu", "cuda"])
def test_a_reduce_op_code_outside_the_table_is_refused_naming_it(code, executor):
    # The CUDA runner checks its arguments before it touches a GPU, so a CUDA build tests it without one.
    if executor == "cuda" and not _jaxcoll.with_cuda:
        pytest.skip("jaxcoll was built without the CUDA executor")
    run = runtime.run_words if executor == "cpu" else runtime.run_words_cuda
    xs = [np.ones(4, np.float32), np.ones(4, np.float32)]
    with pytest.raises(ValueError, match=rf"reduce_op must be 0 \(sum\), 1 \(max\) or 2 \(min\), got {code}"):
        run(encode(direct.all_reduce(2)), xs, (4,), reduce_op=code)


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_the_lowering_writes_the_table_target_and_code(op):
    x = put(np.zeros((8, 4), np.float32), "2x4")
    text = sharded(lambda v: jaxcoll.all_reduce(v, "y", op=op), "2x4").lower(x).as_text()
    calls = re.findall(r'stablehlo.custom_call @(\w+)\(.*?reduce_op = (-?\d+) : i32', text)
    assert calls == [("jaxcoll_all_reduce", str({"sum": 0, "max": 1, "min": 2}[op]))]
