"""Compressed collectives: fewer bytes on the wire for gradients (issue 18; docs/compression.md).

- Wire formats (formats.py): `Bf16`, `Fp8` (e4m3, a scale per block), `Int8` (absmax scale per block), each
  with its per-element error bound; `quantize` is a format's round trip with a straight-through derivative.
- The codec (codec.py): the block formats' encode, decode and decode-and-sum passes, native kernels on CPU
  (csrc/codec.cc), bitwise equal to formats.py's jax.numpy, which runs on other platforms.
- Quantized collectives (quantized.py): `compression=` on jaxcoll.all_reduce, reduce_scatter, all_gather.
- Sparse all-reduce (sparse.py): `TopK`, `topk_all_reduce` (Ok-Topk's design, O(k) traffic, error feedback).
- Adasum (adasum.py): `adasum`, also `jaxcoll.all_reduce(..., op="adasum")`.
Error feedback for training lives in `jaxcoll.optax.compressed_sync`.
"""

from jaxcoll.compress.adasum import adasum
from jaxcoll.compress.formats import Bf16, Format, Fp8, Int8, quantize
from jaxcoll.compress.sparse import TopK, topk_all_reduce

__all__ = ["Bf16", "Format", "Fp8", "Int8", "TopK", "adasum", "quantize", "topk_all_reduce"]
