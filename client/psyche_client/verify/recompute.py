"""Recompute the plain gradient of one batch, as a trainer's forward/backward would.

The verifier runs the same micro-batched forward/backward as `Trainer.train` (each
micro-batch's mean loss weighted by its share of the samples), at the weights the model has
(the caller moves them to the trainer's lookahead point first: `DistroBackend.recompute`),
without the clipping or the momentum, and returns the gradients in sorted parameter-name
order (the order of a result's tensors). The model's weights are not changed; its `.grad` is
cleared.
"""

from __future__ import annotations

import numpy as np
import torch


def recompute_gradient(
    model: torch.nn.Module, tokens: np.ndarray, micro_batch_size: int, device: torch.device
) -> list[torch.Tensor | None]:
    """Gradients of the mean loss over `tokens` (int64 `(n, seq_len)`), sorted by name."""
    if tokens.ndim != 2 or tokens.shape[0] == 0:
        raise ValueError(f"tokens must be a non-empty (n, seq_len) array, got {tokens.shape}")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    params = sorted(model.named_parameters(), key=lambda item: item[0])
    was_training = model.training
    model.train()
    model.zero_grad(set_to_none=True)
    input_ids = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64)).to(device)
    total = input_ids.shape[0]
    try:
        for micro_batch in torch.split(input_ids, micro_batch_size, dim=0):
            loss = model(input_ids=micro_batch, labels=micro_batch).loss
            if not torch.isfinite(loss.detach()):
                continue
            (loss * (micro_batch.shape[0] / total)).backward()
        grads = [None if p.grad is None else p.grad.detach().clone() for _, p in params]
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return grads
