"""How the kept coefficients' values travel: the value kinds, their quantizers and decoders.

Five kinds, named by the result header's value-kind byte:

* `BF16` (0): every value rounded to bf16, little-endian (`2 * count` bytes).
* `ONE_BIT` (1, the reference's `quantize_1bit`): only the sign, `signbit(v)` packed
  LSB-first; the receiver reads bit 1 as -1 and bit 0 as +1 (`ceil(count / 8)` bytes).
* `TWO_BIT` (2): per chunk a bf16 scale `s = max |v|` over the chunk's kept values, then per
  value a 2-bit code on the uniform grid `{-s, -s/3, +s/3, +s}` (nearest level). The bytes
  are the chunks' scales (`2 * chunks`, little-endian) followed by the codes (`ceil(2 *
  count / 8)`): value j takes bits 2j (sign, 1 = negative) and 2j + 1 (1 = full scale,
  0 = a third) of an LSB-first stream, zero-padded.
* `TWO_BIT_CODEBOOK` (3): per chunk two bf16 statistics of the kept values' magnitudes, their
  mean `mu` and standard deviation `sigma`, then per value a 2-bit code on the four levels
  `{-hi, -lo, +lo, +hi}` with `lo = max(mu - sigma, 0)` and `hi = mu + sigma` (nearest).
  Top-k keeps the large values of both signs, so the magnitudes cluster; their mean and spread
  place the levels where the values are instead of at fractions of the largest one. The bytes
  are the chunks' `(mu, sigma)` pairs (`4 * chunks`, little-endian, chunk by chunk) followed
  by codes laid out like `TWO_BIT`'s (bit 2j + 1: 1 = `hi`, 0 = `lo`).
* `FOUR_BIT` (4): per chunk a bf16 scale `s = max |v|`, then per value a sign bit and a 3-bit
  magnitude `m` standing for `(m + 1) * s / 8` (nearest). The bytes are the chunks' scales
  (`2 * chunks`) followed by the codes (`ceil(4 * count / 8)`): value j takes bits 4j (sign,
  1 = negative) and 4j + 1 .. 4j + 3 (`m`, least significant bit first) of an LSB-first
  stream, zero-padded.

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
    TWO_BIT_CODEBOOK = 3
    FOUR_BIT = 4


_NAMES = {
    ValueKind.BF16: "bf16",
    ValueKind.ONE_BIT: "1-bit",
    ValueKind.TWO_BIT: "2-bit",
    ValueKind.TWO_BIT_CODEBOOK: "2-bit codebook",
    ValueKind.FOUR_BIT: "4-bit",
}


def value_bytes(kind: ValueKind, chunks: int, k: int) -> int:
    """Bytes taken by the values of `chunks` chunks of `k` kept coefficients."""
    count = chunks * k
    if kind == ValueKind.ONE_BIT:
        return (count + 7) // 8
    if kind == ValueKind.TWO_BIT:
        return 2 * chunks + (2 * count + 7) // 8
    if kind == ValueKind.TWO_BIT_CODEBOOK:
        return 4 * chunks + (2 * count + 7) // 8
    if kind == ValueKind.FOUR_BIT:
        return 2 * chunks + (4 * count + 7) // 8
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
    if kind == ValueKind.TWO_BIT_CODEBOOK:
        return _quantize_codebook(val)
    if kind == ValueKind.FOUR_BIT:
        return _quantize_four_bit(val)
    packed = pack_bf16(val)
    return packed, val.to(torch.bfloat16).to(val.dtype)


def dequantize(data: bytes, kind: ValueKind, chunks: int, k: int) -> np.ndarray:
    """The values a receiver reads from `data`: float64 `[chunks, k]`."""
    count = chunks * k
    if kind == ValueKind.ONE_BIT:
        return unpack_signs(data, count).numpy().astype(np.float64).reshape(chunks, k)
    if kind == ValueKind.TWO_BIT:
        return _dequantize_two_bit(data, chunks, k)
    if kind == ValueKind.TWO_BIT_CODEBOOK:
        return _dequantize_codebook(data, chunks, k)
    if kind == ValueKind.FOUR_BIT:
        return _dequantize_four_bit(data, chunks, k)
    if len(data) != 2 * count:
        raise ValueError(f"bf16 value bytes ({len(data)}) do not hold exactly {count} values")
    values = unpack_bf16(data).to(torch.float64).numpy().reshape(chunks, k)
    if not np.isfinite(values).all():
        raise ValueError("values contain NaN or infinity")
    return values


# ---- two-bit codes --------------------------------------------------------------------------

_THIRD = 1.0 / 3.0


def _absmax_scale(val: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per chunk the bf16 scale `max |v|` (`[chunks, 1]`), the same in float64, and every
    `|v| / scale` in float64 (0 in an all-zero chunk): what the 2-bit and 4-bit grids share."""
    scale = val.detach().abs().amax(dim=-1, keepdim=True).to(torch.bfloat16)
    scale64 = scale.to(torch.float64)
    ratio = val.detach().abs().to(torch.float64) / torch.where(scale64 > 0, scale64, 1.0)
    return scale, scale64, ratio


def _quantize_two_bit(val: torch.Tensor) -> tuple[bytes, torch.Tensor]:
    chunks = val.shape[0]
    scale, scale64, ratio = _absmax_scale(val)
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
    scale = _read_statistics(data, ValueKind.TWO_BIT, chunks, k, 1)[0]
    codes = _read_codes(data[2 * chunks :], chunks, k, 2, _NAMES[ValueKind.TWO_BIT])
    values = _two_bit_values(scale.reshape(chunks, 1), codes[..., 0], codes[..., 1])
    return values.numpy()


def _read_statistics(
    data: bytes, kind: ValueKind, chunks: int, k: int, per_chunk: int
) -> list[torch.Tensor]:
    """The `per_chunk` bf16 statistics of every chunk (float64, one tensor `[chunks]` each)
    at the start of `data`, checked: the right total length, finite and not negative."""
    name = _NAMES[kind]
    if len(data) != value_bytes(kind, chunks, k):
        raise ValueError(
            f"{name} value bytes ({len(data)}) do not hold exactly {chunks * k} values"
        )
    stats = unpack_bf16(data[: 2 * per_chunk * chunks]).to(torch.float64)
    if not bool(stats.isfinite().all()):
        raise ValueError(f"{name} chunk scales contain NaN or infinity")
    if bool((stats < 0).any()) or bool(torch.signbit(stats).any()):
        raise ValueError(f"{name} chunk scales must not be negative")
    table = stats.reshape(chunks, per_chunk)
    return [table[:, j].contiguous() for j in range(per_chunk)]


def _read_codes(data: bytes, chunks: int, k: int, width: int, name: str) -> torch.Tensor:
    """`[chunks, k, width]` bools from an LSB-first stream whose padding must be zero."""
    count = chunks * k
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    if bits[width * count :].any():
        raise ValueError(f"padding bits after the last {name} code are not zero")
    return torch.from_numpy(bits[: width * count].reshape(chunks, k, width).astype(bool))


# ---- two-bit codebook (mean +- standard deviation of the magnitudes) --------------------------


def _quantize_codebook(val: torch.Tensor) -> tuple[bytes, torch.Tensor]:
    magnitude = val.detach().abs().to(torch.float64)
    mean = magnitude.mean(dim=-1).to(torch.bfloat16)
    std = magnitude.std(dim=-1, correction=0).to(torch.bfloat16)
    lo, hi = _codebook_levels(mean.to(torch.float64), std.to(torch.float64))
    high = (magnitude - lo) > (hi - magnitude)  # nearest level; a tie goes to lo
    negative = torch.signbit(val.detach())
    codes = torch.stack((negative, high), dim=-1).reshape(-1).to("cpu").numpy()
    stats = torch.stack((mean, std), dim=-1).reshape(-1)
    packed = pack_bf16(stats) + np.packbits(codes, bitorder="little").tobytes()
    magnitudes = torch.where(high, hi, lo)
    values = torch.where(negative, -magnitudes, magnitudes)
    return packed, values.to(device=val.device, dtype=val.dtype)


def _codebook_levels(mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(lo, hi)` as `[chunks, 1]` float64 from the chunks' bf16 statistics `[chunks]`."""
    lo = (mean - std).clamp(min=0.0)
    hi = mean + std
    return lo.reshape(-1, 1), hi.reshape(-1, 1)


def _dequantize_codebook(data: bytes, chunks: int, k: int) -> np.ndarray:
    mean, std = _read_statistics(data, ValueKind.TWO_BIT_CODEBOOK, chunks, k, 2)
    codes = _read_codes(data[4 * chunks :], chunks, k, 2, _NAMES[ValueKind.TWO_BIT_CODEBOOK])
    lo, hi = _codebook_levels(mean, std)
    magnitudes = torch.where(codes[..., 1], hi, lo)
    return torch.where(codes[..., 0], -magnitudes, magnitudes).numpy()


# ---- four-bit codes -------------------------------------------------------------------------

_FOUR_BIT_STEPS = 8
_MAGNITUDE_WEIGHTS = np.array([1, 2, 4], dtype=np.int64)


def _quantize_four_bit(val: torch.Tensor) -> tuple[bytes, torch.Tensor]:
    chunks = val.shape[0]
    scale, scale64, ratio = _absmax_scale(val)
    level = torch.round(ratio * _FOUR_BIT_STEPS).clamp(1, _FOUR_BIT_STEPS).to(torch.int64) - 1
    negative = torch.signbit(val.detach())
    level_bits = (level.unsqueeze(-1) >> torch.arange(3, device=level.device)) & 1
    codes = torch.cat((negative.unsqueeze(-1), level_bits.bool()), dim=-1)
    packed = (
        pack_bf16(scale.reshape(-1))
        + np.packbits(codes.reshape(-1).to("cpu").numpy(), bitorder="little").tobytes()
    )
    values = _four_bit_values(scale64.reshape(chunks, 1), negative, level)
    return packed, values.to(device=val.device, dtype=val.dtype)


def _four_bit_values(
    scale: torch.Tensor, negative: torch.Tensor, level: torch.Tensor
) -> torch.Tensor:
    """`+-(level + 1) * s / 8` in float64 from per-chunk scales `[chunks, 1]` and the codes."""
    magnitude = scale * (level.to(torch.float64) + 1.0) / _FOUR_BIT_STEPS
    return torch.where(negative, -magnitude, magnitude)


def _dequantize_four_bit(data: bytes, chunks: int, k: int) -> np.ndarray:
    scale = _read_statistics(data, ValueKind.FOUR_BIT, chunks, k, 1)[0]
    codes = _read_codes(data[2 * chunks :], chunks, k, 4, _NAMES[ValueKind.FOUR_BIT]).numpy()
    level = torch.from_numpy(codes[..., 1:].astype(np.int64) @ _MAGNITUDE_WEIGHTS)
    negative = torch.from_numpy(codes[..., 0])
    return _four_bit_values(scale.reshape(chunks, 1), negative, level).numpy()
