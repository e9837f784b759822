"""How the kept coefficients' values travel: the value kinds, their quantizers and decoders.

Three kinds, named by the result header's value-kind byte:

* `BF16` (0): every value rounded to bf16, little-endian (`2 * count` bytes).
* `ONE_BIT` (1, the reference's `quantize_1bit`): only the sign, `signbit(v)` packed
  LSB-first; the receiver reads bit 1 as -1 and bit 0 as +1 (`ceil(count / 8)` bytes).
* `TWO_BIT` (2): per chunk a bf16 scale `s = max |v|` over the chunk's kept values, then per
  value a 2-bit code on the uniform grid `{-s, -s/3, +s/3, +s}` (nearest level). The bytes
  are the chunks' scales (`2 * chunks`, little-endian) followed by the codes (`ceil(2 *
  count / 8)`): value j takes bits 2j (sign, 1 = negative) and 2j + 1 (1 = full scale,
  0 = a third) of an LSB-first stream, zero-padded.

`quantize(val, kind)` returns the bytes and the values a receiver will read back (what
error feedback subtracts when the sender's own copy must match what it sent);
`dequantize(data, kind, chunks, k)` is the receiver's side and raises `ValueError` on bytes
no sender can produce (wrong length, non-zero padding, NaN/inf, negative scales).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import torch

from psyche_client.distro.compress import pack_bf16, pack_signs, unpack_bf16, unpack_signs


class ValueKind(IntEnum):
    BF16 = 0
    ONE_BIT = 1
    TWO_BIT = 2


def value_bytes(kind: ValueKind, chunks: int, k: int) -> int:
    """Bytes taken by the values of `chunks` chunks of `k` kept coefficients."""
    count = chunks * k
    if kind == ValueKind.ONE_BIT:
        return (count + 7) // 8
    if kind == ValueKind.TWO_BIT:
        return 2 * chunks + (2 * count + 7) // 8
    return 2 * count


def quantize(val: torch.Tensor, kind: ValueKind) -> tuple[bytes, torch.Tensor]:
    """`(packed bytes, dequantized values)` of `val` (`[chunks, k]`, any float dtype).

    The dequantized values have `val`'s dtype and device; for `ONE_BIT` they are the +-1 a
    receiver reads.
    """
    if kind == ValueKind.ONE_BIT:
        packed = pack_signs(val)
        signs = torch.where(torch.signbit(val), -1.0, 1.0).to(val.dtype)
        return packed, signs
    if kind == ValueKind.TWO_BIT:
        return _quantize_two_bit(val)
    packed = pack_bf16(val)
    return packed, val.to(torch.bfloat16).to(val.dtype)


def dequantize(data: bytes, kind: ValueKind, chunks: int, k: int) -> np.ndarray:
    """The values a receiver reads from `data`: float64 `[chunks, k]`."""
    count = chunks * k
    if kind == ValueKind.ONE_BIT:
        return unpack_signs(data, count).numpy().astype(np.float64).reshape(chunks, k)
    if kind == ValueKind.TWO_BIT:
        return _dequantize_two_bit(data, chunks, k)
    if len(data) != 2 * count:
        raise ValueError(f"bf16 value bytes ({len(data)}) do not hold exactly {count} values")
    values = unpack_bf16(data).to(torch.float64).numpy().reshape(chunks, k)
    if not np.isfinite(values).all():
        raise ValueError("values contain NaN or infinity")
    return values


# ---- two-bit codes --------------------------------------------------------------------------

_THIRD = 1.0 / 3.0


def _quantize_two_bit(val: torch.Tensor) -> tuple[bytes, torch.Tensor]:
    chunks = val.shape[0]
    scale = val.detach().abs().amax(dim=-1, keepdim=True).to(torch.bfloat16)
    scale64 = scale.to(torch.float64)
    ratio = val.detach().abs().to(torch.float64) / torch.where(scale64 > 0, scale64, 1.0)
    full = ratio > 2.0 * _THIRD  # nearest of s/3 and s (|v| <= s by construction)
    negative = torch.signbit(val.detach())
    codes = torch.stack((negative, full), dim=-1).reshape(-1).to("cpu").numpy()
    packed = pack_bf16(scale.reshape(-1)) + np.packbits(codes, bitorder="little").tobytes()
    values = _two_bit_values(scale64.reshape(chunks, 1), negative, full)
    return packed, values.to(device=val.device, dtype=val.dtype)


def _two_bit_values(
    scale: torch.Tensor, negative: torch.Tensor, full: torch.Tensor
) -> torch.Tensor:
    """`+-s` or `+-s/3` in float64 from per-chunk scales `[chunks, 1]` and the code bits."""
    magnitude = torch.where(full, scale, scale * _THIRD)
    return torch.where(negative, -magnitude, magnitude)


def _dequantize_two_bit(data: bytes, chunks: int, k: int) -> np.ndarray:
    count = chunks * k
    if len(data) != value_bytes(ValueKind.TWO_BIT, chunks, k):
        raise ValueError(f"2-bit value bytes ({len(data)}) do not hold exactly {count} values")
    scale = unpack_bf16(data[: 2 * chunks]).to(torch.float64)
    if not bool(scale.isfinite().all()):
        raise ValueError("2-bit chunk scales contain NaN or infinity")
    if bool((scale < 0).any()) or bool(torch.signbit(scale).any()):
        raise ValueError("2-bit chunk scales must not be negative")
    bits = np.unpackbits(np.frombuffer(data[2 * chunks :], dtype=np.uint8), bitorder="little")
    if bits[2 * count :].any():
        raise ValueError("padding bits after the last 2-bit code are not zero")
    codes = torch.from_numpy(bits[: 2 * count].reshape(chunks, k, 2).astype(bool))
    values = _two_bit_values(scale.reshape(chunks, 1), codes[..., 0], codes[..., 1])
    return values.numpy()
