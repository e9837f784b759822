"""A tiny net with awkward parameter shapes and DisTrO results of it, for the DisTrO unit
tests."""

from __future__ import annotations

import torch
from psyche_client.distro import DistroOptimizer, DistroSettings, Generated
from psyche_common.batch_id import BatchId


class TinyNet(torch.nn.Module):
    """Parameters with chunk-friendly and awkward shapes (names sort as b < w_a < w_z)."""

    def __init__(self, seed: int = 0, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.w_z = torch.nn.Parameter(torch.randn(16, 24, generator=gen, dtype=dtype))
        self.w_a = torch.nn.Parameter(torch.randn(10, 8, generator=gen, dtype=dtype))
        self.b = torch.nn.Parameter(torch.randn(12, generator=gen, dtype=dtype))


SETTINGS = DistroSettings(
    compression_decay=0.9, compression_topk=3, compression_chunk=4, quantize_1bit=False
)


def set_random_grads(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype)


def generate_result(
    settings: DistroSettings = SETTINGS, seed: int = 0, step: int = 3, start: int = 8
) -> tuple[DistroOptimizer, Generated]:
    model = TinyNet()
    optimizer = DistroOptimizer(model.named_parameters(), settings)
    set_random_grads(model, seed)
    generated = optimizer.generate(0.01, step, BatchId(start, start + 3), trainer_nonce=2)
    return optimizer, generated
