"""Value format `1-bit` (header byte 1, the reference's `quantize_1bit`): only the sign,
`signbit(v)` packed LSB-first; the receiver reads bit 1 as -1 and bit 0 as +1
(`ceil(count / 8)` bytes). The values carry no magnitude, so receivers aggregate them as
they are (no per-tensor normalisation)."""

from __future__ import annotations

import numpy as np
import torch

from psyche_client.distro.values.codec import ValueCodec
from psyche_client.distro.values.packing import pack_signs, unpack_signs


class OneBitValues(ValueCodec):
    name = "1-bit"
    carries_magnitudes = False

    def size(self, chunks: int, k: int) -> int:
        return (chunks * k + 7) // 8

    def quantize(self, val: torch.Tensor) -> tuple[bytes, torch.Tensor]:
        """The +-1 a receiver reads, in `val`'s dtype."""
        signs = torch.where(torch.signbit(val), -1.0, 1.0).to(val.dtype)
        return pack_signs(val), signs

    def dequantize(self, data: bytes, chunks: int, k: int) -> np.ndarray:
        return unpack_signs(data, chunks * k).numpy().astype(np.float64).reshape(chunks, k)
