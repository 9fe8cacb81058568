"""The custom call's binary interface (docs/plan-ir.md, "The custom call"): the names and codes that the lowering
writes into a jaxcoll custom call and the native handlers read back, spelled once for Python.

csrc/abi.hpp spells the same table for C++; the native module reports its copy (`jaxcoll._jaxcoll.abi()`) and
tests/test_abi.py holds the two together, so neither side can drift alone. The reductions' names are the plan IR's
(`jaxcoll.plan.ir.REDUCE_OPS`, also the words of a plan file's `expect`) and the targets' are its collectives':
this module only numbers and prefixes them.
"""

from __future__ import annotations

from jaxcoll.plan.ir import REDUCE_OPS, Collective

# The `reduce_op` attribute (s32): a reduction's position in REDUCE_OPS. Never renumber: compiled programs carry it.
REDUCE_OP_CODES = {name: code for code, name in enumerate(REDUCE_OPS)}

TARGET_PREFIX = "jaxcoll_"


def target_name(collective: Collective | str) -> str:
    """The FFI target of a plan's collective: "jaxcoll_" + its name (registered for every platform jaxcoll runs on)."""
    return TARGET_PREFIX + Collective(collective).value


# Every FFI target, in the order of the collectives' wire codes.
TARGETS = tuple(target_name(c) for c in Collective)

# The network steps of a collective across GPU hosts (jaxcoll.algorithms.across_hosts): registered for XLA's CUDA
# platform only; its `collective` attribute is the collective's wire code.
NETWORK_TARGET = TARGET_PREFIX + "network"

# The sparse all-reduce's local stages (jaxcoll.compress.sparse; csrc/topk.hpp), in the order of a call: select
# the buckets, the owner's sum and reselection, the dense result, the residual. Registered for platform "cpu" only.
TOPK_SELECT_TARGET = TARGET_PREFIX + "topk_select"
TOPK_REDUCE_TARGET = TARGET_PREFIX + "topk_reduce"
TOPK_RESULT_TARGET = TARGET_PREFIX + "topk_result"
TOPK_RESIDUAL_TARGET = TARGET_PREFIX + "topk_residual"
SPARSE_TARGETS = (TOPK_SELECT_TARGET, TOPK_REDUCE_TARGET, TOPK_RESULT_TARGET, TOPK_RESIDUAL_TARGET)

# The codec of the quantized collectives (jaxcoll.compress.codec, xla_ffi/codec_handlers.cc): stateless kernels, registered
# for platform "cpu" only; their operands and attributes are documented in jaxcoll/compress/codec.py.
CODEC_ENCODE_TARGET = TARGET_PREFIX + "codec_encode"
CODEC_DECODE_TARGET = TARGET_PREFIX + "codec_decode"
CODEC_DECODE_SUM_TARGET = TARGET_PREFIX + "codec_decode_sum"
CODEC_DECODE_SUM_ENCODE_TARGET = TARGET_PREFIX + "codec_decode_sum_encode"
CODEC_ENCODE_WIRE_TARGET = TARGET_PREFIX + "codec_encode_wire"
CODEC_DECODE_SUM_WIRE_TARGET = TARGET_PREFIX + "codec_decode_sum_wire"
CODEC_DECODE_SUM_ENCODE_WIRE_TARGET = TARGET_PREFIX + "codec_decode_sum_encode_wire"
CODEC_DECODE_WIRE_TARGET = TARGET_PREFIX + "codec_decode_wire"
CODEC_TARGETS = (CODEC_ENCODE_TARGET, CODEC_DECODE_TARGET, CODEC_DECODE_SUM_TARGET, CODEC_DECODE_SUM_ENCODE_TARGET,
                 CODEC_ENCODE_WIRE_TARGET, CODEC_DECODE_SUM_WIRE_TARGET, CODEC_DECODE_SUM_ENCODE_WIRE_TARGET,
                 CODEC_DECODE_WIRE_TARGET)
