"""Value format `4-bit` (header byte 4): per chunk a bf16 scale `s = max |v|`, then per value
a sign bit and a 3-bit magnitude `m` standing for `(m + 1) * s / 8` (nearest). The bytes are
the chunks' scales (`2 * chunks`) followed by the codes (`ceil(4 * count / 8)`): value j
takes bits 4j (sign, 1 = negative) and 4j + 1 .. 4j + 3 (`m`, least significant bit first)
of an LSB-first stream, zero-padded."""

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

_STEPS = 8
_MAGNITUDE_WEIGHTS = np.array([1, 2, 4], dtype=np.int64)


class FourBitValues(ValueCodec):
    name = "4-bit"

    def size(self, chunks: int, k: int) -> int:
        return 2 * chunks + (4 * chunks * k + 7) // 8

    def quantize(self, val: torch.Tensor) -> tuple[bytes, torch.Tensor]:
        chunks = val.shape[0]
        scale, scale64, ratio = absmax_scale(val)
        level = torch.round(ratio * _STEPS).clamp(1, _STEPS).to(torch.int64) - 1
        negative = torch.signbit(val.detach())
        level_bits = (level.unsqueeze(-1) >> torch.arange(3, device=level.device)) & 1
        codes = torch.cat((negative.unsqueeze(-1), level_bits.bool()), dim=-1)
        packed = pack_bf16(scale.reshape(-1)) + packed_codes(codes)
        values = _values(scale64.reshape(chunks, 1), negative, level)
        return packed, values.to(device=val.device, dtype=val.dtype)

    def dequantize(self, data: bytes, chunks: int, k: int) -> np.ndarray:
        scale = read_statistics(self, data, chunks, k, 1)[0]
        codes = read_codes(data[2 * chunks :], chunks, k, 4, self.name).numpy()
        level = torch.from_numpy(codes[..., 1:].astype(np.int64) @ _MAGNITUDE_WEIGHTS)
        negative = torch.from_numpy(codes[..., 0])
        return _values(scale.reshape(chunks, 1), negative, level).numpy()


def _values(scale: torch.Tensor, negative: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    """`+-(level + 1) * s / 8` in float64 from per-chunk scales `[chunks, 1]` and the codes."""
    magnitude = scale * (level.to(torch.float64) + 1.0) / _STEPS
    return torch.where(negative, -magnitude, magnitude)
