"""Named scratch buffers, between writing a program and compiling it.

A program may name its own scratch buffers (`chunk(r, "stage", i)`). Their sizes are known only once the whole
program is written, so while it is written a chunk of one carries a placeholder index in the rank's scratch:
buffer number b (in order of first use) at index i is `placeholder(b, i)`. The compiler's `layout_scratch` then
puts every named buffer after the plain "scratch" chunks and rewrites the placeholders (`named_place`).
"""

from __future__ import annotations

# Far above any plain scratch index a program writes, so that a placeholder is never a real chunk.
BASE = 1 << 20


def placeholder(buffer_number: int, index: int) -> int:
    """The scratch index that stands for chunk `index` of named buffer `buffer_number` until layout."""
    return BASE * (buffer_number + 1) + index


def is_placeholder(index: int) -> bool:
    return index >= BASE


def named_place(index: int) -> tuple[int, int]:
    """(buffer number, index within that buffer) of a placeholder index."""
    number, offset = divmod(index, BASE)
    return number - 1, offset
