"""Sign agreement between a trainer's DisTrO result and a gradient recomputed by a verifier.

A DisTrO result is the top-k of the DCT of the trainer's momentum, which holds the trainer's
whole history, so nobody else can recompute it bit for bit. What a verifier can recompute is
the gradient of the same batch at the same weights. `gradient_coefficients` takes that
gradient through the same tiled DCT (no momentum, no top-k); `sign_agreement` then compares,
at the positions the trainer chose, the signs it sent with the signs of those coefficients.
An honest momentum leans the same way as the fresh gradient more often than not; a negated
result leans the other way (docs/verification.md has the measured distributions).

Pure functions on tensors; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from psyche_client.distro.compressor import Compressor
from psyche_client.distro.result import DistroResult
from psyche_client.verify.threshold import ACCUSE_BELOW

__all__ = ["ACCUSE_BELOW", "Agreement", "gradient_coefficients", "sign_agreement"]


@dataclass(frozen=True)
class Agreement:
    """`fraction`: share of the result's positions whose signs agree with the recomputed
    coefficients; `weighted`: the same, each position weighted by |recomputed coefficient|;
    `positions`: how many positions were compared (zero coefficients are skipped)."""

    fraction: float
    weighted: float
    positions: int


@torch.no_grad()
def gradient_coefficients(
    compressor: Compressor, grads: Sequence[torch.Tensor | None]
) -> list[np.ndarray]:
    """Per parameter (the compressor's order), the DCT coefficients of `grads` as float32
    `[chunks, totalk]` arrays (a missing gradient counts as zeros)."""
    layout = compressor.layout
    if len(grads) != len(layout.tensors):
        raise ValueError(f"got {len(grads)} gradients for {len(layout.tensors)} parameters")
    out: list[np.ndarray] = []
    for expected, grad in zip(layout.tensors, grads, strict=True):
        if grad is None:
            out.append(np.zeros((expected.chunks, expected.totalk), dtype=np.float32))
            continue
        if tuple(grad.shape) != tuple(expected.shape):
            raise ValueError(
                f"gradient of {expected.name!r} has shape {tuple(grad.shape)}, "
                f"expected {tuple(expected.shape)}"
            )
        encoded = compressor.transform.encode(grad.detach().to(torch.float32).cpu())
        out.append(encoded.reshape(expected.chunks, expected.totalk).numpy().copy())
    return out


def sign_agreement(result: DistroResult, coefficients: Sequence[np.ndarray]) -> Agreement:
    """Compare the signs `result` sent with `coefficients` at the positions it chose.

    Raises `ValueError` when the result does not fit the coefficients' layout.
    """
    if len(result.tensors) != len(coefficients):
        raise ValueError(
            f"result for {result.batch_id} has {len(result.tensors)} tensors, "
            f"expected {len(coefficients)}"
        )
    chosen = [
        (payload.indices(), np.sign(payload.values(result.value_kind)))
        for payload in result.tensors
    ]
    try:
        return agreement_at(chosen, coefficients)
    except ValueError as exc:
        raise ValueError(f"result for {result.batch_id}: {exc}") from exc


def agreement_at(
    chosen: Sequence[tuple[np.ndarray, np.ndarray]], coefficients: Sequence[np.ndarray]
) -> Agreement:
    """`sign_agreement` on raw per-parameter `(indices [chunks, k], signs [chunks, k])`."""
    agree = 0
    total = 0
    weight_agree = 0.0
    weight_total = 0.0
    for (idx, signs), coef in zip(chosen, coefficients, strict=True):
        if idx.shape != signs.shape or idx.shape[0] != coef.shape[0]:
            raise ValueError(f"indices {idx.shape} do not fit coefficients {coef.shape}")
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= coef.shape[1]):
            raise ValueError("an index is outside its chunk")
        recomputed = np.take_along_axis(coef, idx, axis=-1).astype(np.float64)
        mask = (recomputed != 0.0) & (signs != 0.0)
        same = (np.sign(recomputed) == np.sign(signs)) & mask
        magnitude = np.abs(recomputed)
        agree += int(same.sum())
        total += int(mask.sum())
        weight_agree += float(magnitude[same].sum())
        weight_total += float(magnitude[mask].sum())
    if total == 0:
        return Agreement(0.5, 0.5, 0)
    weighted = weight_agree / weight_total if weight_total > 0 else 0.5
    return Agreement(agree / total, weighted, total)
