"""Value format `2-bit codebook` (header byte 3): per chunk two bf16 statistics of the kept
values' magnitudes, their mean `mu` and standard deviation `sigma`, then per value a 2-bit
code on the four levels `{-hi, -lo, +lo, +hi}` with `lo = max(mu - sigma, 0)` and
`hi = mu + sigma` (nearest; a tie goes to `lo`). Top-k keeps the large values of both signs,
so the magnitudes cluster; their mean and spread place the levels where the values are
instead of at fractions of the largest one. The bytes are the chunks' `(mu, sigma)` pairs
(`4 * chunks`, little-endian, chunk by chunk) followed by codes laid out like `2-bit`'s
(bit 2j: sign, 1 = negative; bit 2j + 1: 1 = `hi`, 0 = `lo`)."""

from __future__ import annotations

import numpy as np
import torch

from psyche_client.distro.values.codec import ValueCodec, packed_codes, read_codes, read_statistics
from psyche_client.distro.values.packing import pack_bf16


class CodebookValues(ValueCodec):
    name = "2-bit codebook"

    def size(self, chunks: int, k: int) -> int:
        return 4 * chunks + (2 * chunks * k + 7) // 8

    def quantize(self, val: torch.Tensor) -> tuple[bytes, torch.Tensor]:
        magnitude = val.detach().abs().to(torch.float64)
        mean = magnitude.mean(dim=-1).to(torch.bfloat16)
        std = magnitude.std(dim=-1, correction=0).to(torch.bfloat16)
        lo, hi = _levels(mean.to(torch.float64), std.to(torch.float64))
        high = (magnitude - lo) > (hi - magnitude)  # nearest level; a tie goes to lo
        negative = torch.signbit(val.detach())
        stats = torch.stack((mean, std), dim=-1).reshape(-1)
        packed = pack_bf16(stats) + packed_codes(torch.stack((negative, high), dim=-1))
        magnitudes = torch.where(high, hi, lo)
        values = torch.where(negative, -magnitudes, magnitudes)
        return packed, values.to(device=val.device, dtype=val.dtype)

    def dequantize(self, data: bytes, chunks: int, k: int) -> np.ndarray:
        mean, std = read_statistics(self, data, chunks, k, 2)
        codes = read_codes(data[4 * chunks :], chunks, k, 2, self.name)
        lo, hi = _levels(mean, std)
        magnitudes = torch.where(codes[..., 1], hi, lo)
        return torch.where(codes[..., 0], -magnitudes, magnitudes).numpy()


def _levels(mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(lo, hi)` as `[chunks, 1]` float64 from the chunks' bf16 statistics `[chunks]`."""
    lo = (mean - std).clamp(min=0.0)
    hi = mean + std
    return lo.reshape(-1, 1), hi.reshape(-1, 1)
