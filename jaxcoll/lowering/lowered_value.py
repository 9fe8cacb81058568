"""Arranging an operand so that the collective's blocks lie along its leading dimension.

The runtime moves whole blocks of the flattened, contiguous per-rank buffer (docs/plan-ir.md, "Chunks and
sizes"): all_gather's output block r is rank r's input, reduce_scatter's input block r is what rank r keeps. A
collective along another dimension is therefore a transpose into block-leading form, the custom call, and a
transpose back. `LoweredValue` is a lowered value with its abstract value, and the few layout moves the lowering
rules need; XLA removes the moves that turn out to be identities.
"""

from __future__ import annotations

import dataclasses

from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from jaxcoll import _jax


@dataclasses.dataclass(frozen=True)
class LoweredValue:
    ctx: object  # the lowering rule's context (jax.interpreters.mlir.LoweringRuleContext: private, see _jax.py)
    value: ir.Value
    aval: object  # value's abstract value (a ShapedArray, as jax.typeof gives)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.aval.shape)

    def reshape(self, shape) -> "LoweredValue":
        shape = tuple(shape)
        if shape == self.shape:
            return self
        aval = self.aval.update(shape=shape)
        return LoweredValue(self.ctx, _jax.reshape_hlo(self.ctx, self.value, aval), aval)

    def moveaxis(self, src: int, dst: int) -> "LoweredValue":
        if src == dst:
            return self
        perm = [i for i in range(len(self.shape)) if i != src]
        perm.insert(dst, src)
        aval = self.aval.update(shape=tuple(self.shape[i] for i in perm))
        value = hlo.transpose(self.value, ir.DenseI64ArrayAttr.get(perm))
        return LoweredValue(self.ctx, value, aval)

    def split(self, axis: int, parts: int) -> "LoweredValue":
        """Split dimension `axis` into (parts, size // parts)."""
        shape = list(self.shape)
        shape[axis:axis + 1] = [parts, shape[axis] // parts]
        return self.reshape(shape)

    def merge(self, axis: int) -> "LoweredValue":
        """Merge dimensions `axis` and `axis + 1` into one."""
        shape = list(self.shape)
        shape[axis:axis + 2] = [shape[axis] * shape[axis + 1]]
        return self.reshape(shape)
