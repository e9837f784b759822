"""Value format `bf16` (header byte 0): every value rounded to bf16, little-endian
(`2 * count` bytes)."""

from __future__ import annotations

import numpy as np
import torch

from psyche_client.distro.values.codec import ValueCodec
from psyche_client.distro.values.packing import pack_bf16, unpack_bf16


class Bf16Values(ValueCodec):
    name = "bf16"

    def size(self, chunks: int, k: int) -> int:
        return 2 * chunks * k

    def quantize(self, val: torch.Tensor) -> tuple[bytes, torch.Tensor]:
        return pack_bf16(val), val.to(torch.bfloat16).to(val.dtype)

    def dequantize(self, data: bytes, chunks: int, k: int) -> np.ndarray:
        count = chunks * k
        if len(data) != 2 * count:
            raise ValueError(f"bf16 value bytes ({len(data)}) do not hold exactly {count} values")
        values = unpack_bf16(data).to(torch.float64).numpy().reshape(chunks, k)
        if not np.isfinite(values).all():
            raise ValueError("values contain NaN or infinity")
        return values
