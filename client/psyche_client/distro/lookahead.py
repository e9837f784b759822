"""DisTrO's lookahead point, from a public result (pure tensor math; no I/O).

A trainer whose own result of step S − 1 is still in flight (results are applied two rounds
late: `in_flight`) trains step S at `theta − lr(S−1)·sign(IDCT(r))`, `r` that published
result: the direction its own update will take once applied, as the apply computes it (the
exact integer inverse DCT of `Compressor.aggregated_signs`, the same on every device).

The reference moves along the sign of the trainer's momentum instead, which nobody else
holds; from the published result a verifier recomputes the gradient at the very point the
trainer trained at (`DistroBackend.recompute`), so a trainer that negates its gradients can no
longer have its lookahead turn its negated gradient back into one that passes the check
(docs/verification.md, docs/deviations.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from psyche_client.distro.compressor import Compressor
from psyche_client.distro.result import DistroResult, TensorPayload


@torch.no_grad()
def move_along(
    params: Sequence[tuple[str, torch.nn.Parameter | torch.Tensor]],
    compressor: Compressor,
    result: DistroResult,
    lr: float,
) -> None:
    """`p -= lr * sign(IDCT(result))` for every parameter (in `compressor`'s order, which is
    `result`'s); the caller saves and restores the weights."""
    if len(result.tensors) != len(params):
        raise ValueError(
            f"a lookahead result with {len(result.tensors)} tensors for {len(params)} parameters"
        )
    for i, (_, param) in enumerate(params):
        param.add_(lookahead_step(compressor, i, result.tensors[i], param), alpha=-lr)


def lookahead_step(
    compressor: Compressor, i: int, payload: TensorPayload, like: torch.Tensor
) -> torch.Tensor:
    """`sign(IDCT(payload))` for parameter `i` of `compressor`, in `like`'s shape, dtype and
    device: the direction the lookahead moves that parameter."""
    signs = compressor.aggregated_signs(i, [payload], device=like.device)
    return signs.view(like.shape).to(like.dtype)
