"""The byte packers the value formats share: bf16 values and sign bits.

bf16: every value rounded to bf16, raw little-endian bytes. Signs: `signbit(v)` of every
element (negative, -0.0 included, is 1), packed LSB-first and zero-padded to whole bytes; the
receiver maps bit 1 to -1 and bit 0 to +1, so a coefficient of exactly +0 arrives as +1.
"""

from __future__ import annotations

import numpy as np
import torch


def pack_bf16(val: torch.Tensor) -> bytes:
    """Values rounded to bf16, raw little-endian bytes."""
    bits = val.detach().to(torch.bfloat16).to("cpu").contiguous().view(torch.int16)
    return bits.numpy().astype("<i2").tobytes()


def unpack_bf16(data: bytes) -> torch.Tensor:
    """Inverse of `pack_bf16` (flat bf16 tensor on CPU)."""
    if len(data) % 2:
        raise ValueError(f"bf16 value bytes ({len(data)}) are not a multiple of 2")
    raw = np.frombuffer(data, dtype="<i2").astype(np.int16)
    return torch.from_numpy(raw).view(torch.bfloat16)


def pack_signs(val: torch.Tensor) -> bytes:
    """1-bit quantization: `signbit(val)` of every element, packed LSB-first."""
    bits = torch.signbit(val.detach()).to("cpu").reshape(-1).numpy()
    return np.packbits(bits, bitorder="little").tobytes()


def unpack_signs(data: bytes, count: int) -> torch.Tensor:
    """Inverse of `pack_signs` as float32 +-1 (bit 1 -> -1, bit 0 -> +1); checks padding."""
    if len(data) != (count + 7) // 8:
        raise ValueError(f"sign bytes ({len(data)}) do not hold exactly {count} bits")
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    if bits[count:].any():
        raise ValueError("padding bits after the last sign are not zero")
    signs = 1.0 - 2.0 * bits[:count].astype(np.float32)
    return torch.from_numpy(signs)
