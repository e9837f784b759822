"""Orthonormal DCT-II bases and the tiled transform of a parameter-shaped tensor.

Reference: spec section 1.3. `dct_basis(n)` is F with F[j, k] = c_k * cos(pi (2j+1) k / (2n)),
c_0 = sqrt(1/n), c_k = sqrt(2/n); encoding a vector of length n is `x @ F` and the inverse is
`X @ F.T` (F is orthogonal). Matrices get a separable 2-D DCT on each n1 x n2 tile of their
last two dims; vectors a 1-D DCT on each chunk.

`DctTransform(target_chunk, identity=True)` keeps the tiling but transforms nothing (its
"basis" is the identity, so encoding only cuts tiles out, exactly: every product is by 1 or
0): SparseLoCo's `dct = false`, which selects top-k among the raw values of each tile.

API: `dct_basis(n, dtype=torch.float64, device=None)`, `DctTransform(target_chunk,
identity=False)` with
`encode(x) -> Tensor` of shape `encoded_shape(x.shape)`, `decode(X, shape) -> Tensor`, and
decode's two halves `decode_tiles(X, shape)` and `untile(tiles, shape)`.
Bases are cached per (n, dtype, device) in the instance (no global state). Everything is
plain matmul, so results are deterministic for a given device and dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from psyche_client.distro.chunking import encoded_shape


def dct_basis(
    n: int, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> torch.Tensor:
    """Orthonormal DCT-II matrix F (n x n), built in float64 then cast to `dtype`."""
    if n < 1:
        raise ValueError(f"DCT size must be >= 1, got {n}")
    j = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    k = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    basis = torch.cos(math.pi * (2 * j + 1) * k / (2 * n))
    scale = torch.full((1, n), math.sqrt(2.0 / n), dtype=torch.float64)
    scale[0, 0] = math.sqrt(1.0 / n)
    return (basis * scale).to(dtype=dtype, device=device)


class DctTransform:
    """Tiled DCT encode/decode with a fixed target chunk size."""

    def __init__(self, target_chunk: int, *, identity: bool = False) -> None:
        if target_chunk < 1:
            raise ValueError(f"compression_chunk must be >= 1, got {target_chunk}")
        self.target_chunk = target_chunk
        self.identity = identity
        self._bases: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}
        self._xshapes: dict[tuple[int, ...], tuple[int, ...]] = {}

    def xshape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """`encoded_shape(shape, target_chunk)`, cached per shape."""
        key = tuple(int(d) for d in shape)
        cached = self._xshapes.get(key)
        if cached is None:
            cached = encoded_shape(key, self.target_chunk)
            self._xshapes[key] = cached
        return cached

    def basis(self, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        key = (n, dtype, device)
        cached = self._bases.get(key)
        if cached is None:
            if self.identity:
                cached = torch.eye(n, dtype=dtype, device=device)
            else:
                cached = dct_basis(n, dtype=dtype, device=device)
            self._bases[key] = cached
        return cached

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """DCT of every tile of `x`; returns shape `encoded_shape(x.shape, target_chunk)`."""
        xshape = self.xshape(x.shape)
        if x.dim() >= 2:
            *lead, rows_over, cols_over, n1, n2 = xshape
            f1 = self.basis(n1, x.dtype, x.device)
            f2 = self.basis(n2, x.dtype, x.device)
            tiles = x.reshape(*lead, rows_over, n1, cols_over, n2).transpose(-3, -2)
            # out[.., b, d] = sum_{h,w} F1[h, b] tile[.., h, w] F2[w, d]
            return (f1.transpose(0, 1) @ tiles @ f2).contiguous()
        chunks_, n = xshape
        f = self.basis(n, x.dtype, x.device)
        return x.reshape(chunks_, n) @ f

    def decode(self, encoded: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        """Inverse of `encode`: from `encoded_shape(shape)` back to `shape`."""
        return self.untile(self.decode_tiles(encoded, shape), shape)

    def decode_tiles(self, encoded: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        """The inverse DCT of every tile, still in the encoded layout (`untile` puts the tiles
        in place). Elementwise work done between the two (a sign, a cast) then runs before
        the copy that `untile` makes."""
        xshape = self.xshape(shape)
        if tuple(encoded.shape) != xshape:
            raise ValueError(
                f"encoded tensor has shape {tuple(encoded.shape)}, expected {xshape} "
                f"for a parameter of shape {tuple(shape)}"
            )
        if len(shape) >= 2:
            n1, n2 = xshape[-2], xshape[-1]
            b1 = self.basis(n1, encoded.dtype, encoded.device)
            b2 = self.basis(n2, encoded.dtype, encoded.device)
            return b1 @ encoded @ b2.transpose(0, 1)
        n = xshape[-1]
        f = self.basis(n, encoded.dtype, encoded.device)
        return encoded @ f.transpose(0, 1)

    def untile(self, tiles: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        """Tiles in the encoded layout (`decode_tiles`) back to a tensor of `shape`."""
        if len(shape) >= 2:
            return tiles.transpose(-3, -2).reshape(tuple(shape))
        return tiles.reshape(tuple(shape))
