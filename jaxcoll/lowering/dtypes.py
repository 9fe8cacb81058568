"""The element types the runtime moves and reduces, and the reductions it knows.

Reductions of 16-bit floats accumulate in float32 in the runtime. bool travels as uint8 (one byte, 0 or 1), so
max and min of bools are logical or and and; a bool sum has no meaning the runtime could give it bit-exactly
like jax (psum turns bools into int32), so it is refused.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxcoll.plan.ir import REDUCE_OPS

SUPPORTED = tuple(np.dtype(d) for d in (
    np.float16, jnp.bfloat16, np.float32, np.float64,
    np.int8, np.int32, np.int64, np.uint8, np.uint32, np.bool_))


def check_op(api_name: str, op) -> str:
    if not isinstance(op, str) or op not in REDUCE_OPS:
        raise ValueError(f"{api_name}: op={op!r} is not a known reduction; use one of "
                         f"{', '.join(map(repr, REDUCE_OPS))}")
    return op


def check_dtype(api_name: str, dtype, op: str | None = None) -> None:
    """TypeError naming the dtype unless the runtime can run this call on it (op=None: data movement)."""
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED:
        raise TypeError(f"{api_name}: dtype={dtype.name} is not supported; supported dtypes are "
                        f"{', '.join(d.name for d in SUPPORTED)} (bool only for op='max'/'min' in reductions)")
    if dtype == np.bool_ and op == "sum":
        raise TypeError(f"{api_name}: dtype=bool cannot be reduced with op='sum'; use op='max' (logical or), "
                        f"op='min' (logical and), or cast to an integer type first")
