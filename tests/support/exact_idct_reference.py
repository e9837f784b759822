"""DisTrO's update direction written from its definition (docs/distro.md, "Apply"), with
Python integers only: the reference the fast `exact_idct` path is tested against."""

from __future__ import annotations

import math

import numpy as np
import torch
from psyche_client.distro.exact_idct import P_BITS, integer_basis
from psyche_client.distro.result import TensorLayout


def integer_sign_definition(
    layout: TensorLayout, positions: torch.Tensor, means: torch.Tensor
) -> np.ndarray:
    """sign(G_int) per element in the parameter's shape, with Python integers only."""
    peak = max(abs(float(m)) for m in means.tolist())
    _, exponent = math.frexp(peak)
    xs = [round(float(m) * 2.0 ** (P_BITS - exponent)) for m in means.tolist()]
    if layout.tile_dims == 2:
        *lead, rows_over, cols_over, n1, n2 = layout.xshape
        rows, cols = math.prod(lead) * rows_over, cols_over
    else:
        (rows, n2), n1, cols = layout.xshape, 1, 1
    b1 = [[int(v) for v in row] for row in integer_basis(n1)]
    b2 = [[int(v) for v in row] for row in integer_basis(n2)]
    out = np.zeros((rows * n1, cols * n2), dtype=np.float32)
    by_tile: dict[int, list[tuple[int, int, int]]] = {}
    for pos, x in zip(positions.tolist(), xs, strict=True):
        tile, within = divmod(pos, n1 * n2)
        by_tile.setdefault(tile, []).append((within // n2, within % n2, x))
    for tile, coefs in by_tile.items():
        r, c = divmod(tile, cols)
        for a in range(n1):
            for b in range(n2):
                g = sum(b1[a][j] * x * b2[b][k] for j, k, x in coefs)
                out[r * n1 + a, c * n2 + b] = (g > 0) - (g < 0)
    return out.reshape(layout.shape)
