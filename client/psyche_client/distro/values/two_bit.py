"""Value format `2-bit` (header byte 2): per chunk a bf16 scale `s = max |v|` over the
chunk's kept values, then per value a 2-bit code on the uniform grid `{-s, -s/3, +s/3, +s}`
(nearest level). The bytes are the chunks' scales (`2 * chunks`, little-endian) followed by
the codes (`ceil(2 * count / 8)`): value j takes bits 2j (sign, 1 = negative) and 2j + 1
(1 = full scale, 0 = a third) of an LSB-first stream, zero-padded."""

from __future__ import annotations

import numpy as np
import torch

from psyche_client.distro.values.codec import (
    ValueCodec,
    absmax_scale,
    packed_codes,
    read_codes,
    read_statistics,
)
from psyche_client.distro.values.packing import pack_bf16

_THIRD = 1.0 / 3.0


class TwoBitValues(ValueCodec):
    name = "2-bit"

    def size(self, chunks: int, k: int) -> int:
        return 2 * chunks + (2 * chunks * k + 7) // 8

    def quantize(self, val: torch.Tensor) -> tuple[bytes, torch.Tensor]:
        chunks = val.shape[0]
        scale, scale64, ratio = absmax_scale(val)
        full = ratio > 2.0 * _THIRD  # nearest of s/3 and s (|v| <= s by construction)
        negative = torch.signbit(val.detach())
        packed = pack_bf16(scale.reshape(-1)) + packed_codes(torch.stack((negative, full), -1))
        values = _values(scale64.reshape(chunks, 1), negative, full)
        return packed, values.to(device=val.device, dtype=val.dtype)

    def dequantize(self, data: bytes, chunks: int, k: int) -> np.ndarray:
        scale = read_statistics(self, data, chunks, k, 1)[0]
        codes = read_codes(data[2 * chunks :], chunks, k, 2, self.name)
        return _values(scale.reshape(chunks, 1), codes[..., 0], codes[..., 1]).numpy()


def _values(scale: torch.Tensor, negative: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """`+-s` or `+-s/3` in float64 from per-chunk scales `[chunks, 1]` and the code bits."""
    magnitude = torch.where(full, scale, scale * _THIRD)
    return torch.where(negative, -magnitude, magnitude)
