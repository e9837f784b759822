"""Chunk (tile) sizes for the DCT: per tensor dimension, the largest divisor <= the target.

Reference: `TransformDCT::new` / `get_smaller_split` (spec section 1.2). Every dimension of
every parameter gets a chunk size; matrices (ndim >= 2) are cut into 2-D tiles over their last
two dimensions, vectors into 1-D chunks.

API: `chunk_size(dim, target) -> int`, `tile_shape(shape, target) -> tuple[int, ...]`
(the chunk edge of each transformed dimension: two for ndim >= 2, one for ndim == 1),
`encoded_shape(shape, target)` (the DCT output shape before flattening, the reference's
`xshape`) and `num_chunks(shape, target)`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _divisors(n: int) -> list[int]:
    """All divisors of `n` (n >= 1), ascending, found in O(sqrt(n))."""
    small: list[int] = []
    large: list[int] = []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]


def chunk_size(dim: int, target: int) -> int:
    """Largest divisor of `dim` that is <= `target` (`dim` itself when `target >= dim`).

    A target below 1 gives 1, like the reference (its smallest divisor is 1).
    """
    if dim < 1:
        raise ValueError(f"cannot chunk a dimension of size {dim}; dimensions must be >= 1")
    if target >= dim:
        return dim
    best = 1
    for d in _divisors(dim):
        if d > target:
            break
        best = d
    return best


def tile_shape(shape: Sequence[int], target: int) -> tuple[int, ...]:
    """Chunk edges of the transformed dims: `(n1, n2)` for ndim >= 2, `(n,)` for vectors."""
    if len(shape) == 0:
        raise ValueError("scalar parameters cannot be DCT-compressed (shape is ())")
    dims = shape[-2:] if len(shape) >= 2 else shape
    return tuple(chunk_size(int(d), target) for d in dims)


def encoded_shape(shape: Sequence[int], target: int) -> tuple[int, ...]:
    """Shape of the DCT output: `[..., R/n1, C/n2, n1, n2]` or `[N/n, n]` (the `xshape`)."""
    tiles = tile_shape(shape, target)
    if len(shape) >= 2:
        rows, cols = int(shape[-2]), int(shape[-1])
        n1, n2 = tiles
        return (*(int(d) for d in shape[:-2]), rows // n1, cols // n2, n1, n2)
    (n,) = tiles
    return (int(shape[0]) // n, n)


def num_chunks(shape: Sequence[int], target: int) -> int:
    """Number of tiles (2-D) or chunks (1-D) a parameter of `shape` is cut into."""
    xshape = encoded_shape(shape, target)
    tile_dims = 2 if len(shape) >= 2 else 1
    return math.prod(xshape[:-tile_dims])
