"""What every value format is: the `ValueCodec` interface and the byte checks formats share.

A codec turns the kept coefficients of one tensor, `[chunks, k]`, into the value bytes of a
result and back. `quantize(val)` returns the bytes and the values a receiver will read back
(what error feedback subtracts when the sender's own copy must match what it sent), in
`val`'s dtype and device; `dequantize(data, chunks, k)` is the receiver's side, float64
`[chunks, k]`, and raises `ValueError` on bytes no sender can produce (wrong length, non-zero
padding, NaN/inf, negative scales). `size(chunks, k)` is the exact byte count, so a result's
size follows from its layout alone. `carries_magnitudes` says whether receivers normalise the
values per tensor before aggregating them (`influence`): false only for signs.

Helpers for formats made of per-chunk bf16 statistics followed by an LSB-first stream of
fixed-width codes: `absmax_scale`, `read_statistics`, `read_codes`, `packed_codes`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

from psyche_client.distro.values.packing import unpack_bf16


class ValueCodec(ABC):
    """One value format (registered by its header byte in `values.kinds.ValueKind`)."""

    name: str
    """The format's name in `state.toml` (`value_format`) and in error messages."""
    carries_magnitudes: bool = True

    @abstractmethod
    def size(self, chunks: int, k: int) -> int:
        """Bytes taken by the values of `chunks` chunks of `k` kept coefficients."""

    @abstractmethod
    def quantize(self, val: torch.Tensor) -> tuple[bytes, torch.Tensor]:
        """`(packed bytes, dequantized values)` of `val` (`[chunks, k]`, any float dtype)."""

    @abstractmethod
    def dequantize(self, data: bytes, chunks: int, k: int) -> np.ndarray:
        """The values a receiver reads from `data`: float64 `[chunks, k]`."""


def absmax_scale(val: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per chunk the bf16 scale `max |v|` (`[chunks, 1]`), the same in float64, and every
    `|v| / scale` in float64 (0 in an all-zero chunk): what the 2-bit and 4-bit grids share."""
    scale = val.detach().abs().amax(dim=-1, keepdim=True).to(torch.bfloat16)
    scale64 = scale.to(torch.float64)
    ratio = val.detach().abs().to(torch.float64) / torch.where(scale64 > 0, scale64, 1.0)
    return scale, scale64, ratio


def packed_codes(codes: torch.Tensor) -> bytes:
    """Bool codes (any shape, row-major) as an LSB-first, zero-padded byte stream."""
    return np.packbits(codes.reshape(-1).to("cpu").numpy(), bitorder="little").tobytes()


def read_statistics(
    codec: ValueCodec, data: bytes, chunks: int, k: int, per_chunk: int
) -> list[torch.Tensor]:
    """The `per_chunk` bf16 statistics of every chunk (float64, one tensor `[chunks]` each)
    at the start of `data`, checked: the right total length, finite and not negative."""
    name = codec.name
    if len(data) != codec.size(chunks, k):
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


def read_codes(data: bytes, chunks: int, k: int, width: int, name: str) -> torch.Tensor:
    """`[chunks, k, width]` bools from an LSB-first stream whose padding must be zero."""
    count = chunks * k
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    if bits[width * count :].any():
        raise ValueError(f"padding bits after the last {name} code are not zero")
    return torch.from_numpy(bits[: width * count].reshape(chunks, k, width).astype(bool))
