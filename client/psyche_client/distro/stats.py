"""Per-tensor DisTrO statistics (`--optim-stats-steps`): pure functions of tensors and payloads.

- `l1_energy(t)`: the L1 norm of a tensor, as float. The trainer logs it for each parameter's
  gradient (`grad_energy`) and for its momentum after the gradient was folded in
  (`delta_energy`, the update DisTrO compresses), like the reference's two "energies".
- `captured_energy(coefficients, kept)`: for each tile, the share of its DCT energy (sum of
  squared coefficients) that the top-k kept; a tile with no energy counts as fully kept.
  The DCT is orthonormal, so a tile's coefficient energy equals its energy in the parameter
  domain: 1.0 means compression lost nothing of that tile.
- `index_overlap(indices)`: how much the top-k indices several results chose for one tensor
  agree: the mean, over pairs of results and over tiles, of |A ∩ B| / k. 1.0: every result
  chose the same coefficients; about k / totalk: independent choices. None for fewer than two
  results.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def l1_energy(tensor: torch.Tensor) -> float:
    """The L1 norm of `tensor` (summed in float64)."""
    return float(tensor.detach().abs().sum(dtype=torch.float64))


def captured_energy(coefficients: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Per tile (row), the share of `coefficients`' energy (`[chunks, totalk]`) that the kept
    values (`[chunks, k]`, a subset of each row) hold, as float64 `[chunks]` in [0, 1]."""
    if coefficients.dim() != 2 or kept.dim() != 2 or coefficients.shape[0] != kept.shape[0]:
        raise ValueError(
            f"coefficients {tuple(coefficients.shape)} and kept {tuple(kept.shape)} must be "
            "[chunks, totalk] and [chunks, k]"
        )
    total = coefficients.detach().to(torch.float64).pow(2).sum(dim=-1)
    held = kept.detach().to(torch.float64).pow(2).sum(dim=-1)
    share = torch.where(total > 0, held / torch.where(total > 0, total, 1.0), 1.0)
    return share.clamp(0.0, 1.0)


def mean_captured_energy(coefficients: torch.Tensor, kept: torch.Tensor) -> float:
    """`captured_energy` averaged over the tiles."""
    return float(captured_energy(coefficients, kept).mean())


def index_overlap(indices: Sequence[np.ndarray], totalk: int) -> float | None:
    """The mean over pairs of results and over tiles of |A ∩ B| / k, where each of `indices`
    is one result's `[chunks, k]` chosen positions (distinct within a row, below `totalk`).
    None with fewer than two results."""
    n = len(indices)
    if n < 2:
        return None
    chunks, k = indices[0].shape
    if any(idx.shape != (chunks, k) for idx in indices):
        raise ValueError("every result's indices must have the same [chunks, k] shape")
    if chunks == 0 or k == 0:
        return None
    if any(idx.size and (int(idx.min()) < 0 or int(idx.max()) >= totalk) for idx in indices):
        raise ValueError(f"an index lies outside the tile's {totalk} coefficients")
    counts = np.zeros((chunks, totalk), dtype=np.int64)
    rows = np.arange(chunks)[:, None]
    for idx in indices:
        np.add.at(counts, (rows, idx), 1)
    shared_pairs = int((counts * (counts - 1) // 2).sum())
    pairs = n * (n - 1) // 2
    return shared_pairs / (pairs * chunks * k)
