"""The plan IR (docs/plan-ir.md): what every part of jaxcoll produces or consumes."""

from jaxcoll.plan.errors import PlanError
from jaxcoll.plan.ir import (ZERO, Buffer, ChunkRef, Collective, Expect, Lane, Op, Plan, RankProgram, Step,
                             default_blocks)
from jaxcoll.plan.validate import validate
from jaxcoll.plan.wire import decode, encode

__all__ = ["Buffer", "ChunkRef", "Collective", "Expect", "Lane", "Op", "Plan", "PlanError", "RankProgram", "Step",
           "ZERO", "decode", "default_blocks", "encode", "validate"]
