"""Top-k selection per chunk and the byte packing of indices and values.

`topk_per_chunk` flattens each n1 x n2 tile row-major (index i = b * n2 + d) and keeps the k
coefficients of largest magnitude with their signed values (reference: spec section 1.4).

Indices are bit-packed: every index takes `index_bits(totalk) = ceil(log2(totalk))` bits (12
for a 64 x 64 tile, 6 for a 1-D chunk of 64, 0 for a chunk of one coefficient), the bits of
index j are bits `j*w .. j*w + w - 1` of the stream, least significant bit first, and the
stream is packed LSB-first into bytes (bit i of the stream is bit i % 8 of byte i // 8) and
zero-padded to a whole byte. The reference instead sends u8/u16/u32 little-endian indices.

The value packers (`pack_bf16`, `pack_signs` and their inverses) live with the value formats
(`values.packing`) and are re-exported here.

API: `topk_per_chunk(encoded, topk) -> (idx int64 [chunks, k], val [chunks, k])`,
`index_bits(totalk)`, `index_bytes(count, totalk)`, `pack_indices`, `unpack_indices`,
and the re-exported `pack_bf16`, `unpack_bf16`, `pack_signs`, `unpack_signs`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from psyche_client.distro.values.packing import pack_bf16, pack_signs, unpack_bf16, unpack_signs

__all__ = [
    "effective_k",
    "index_bits",
    "index_bytes",
    "pack_bf16",
    "pack_indices",
    "pack_signs",
    "topk_per_chunk",
    "unpack_bf16",
    "unpack_indices",
    "unpack_signs",
]

_WINDOW_BITS = 25  # an index of up to 25 bits, starting at any bit, fits in 4 bytes


def index_bits(totalk: int) -> int:
    """Bits per packed index for tiles of `totalk` coefficients: `ceil(log2(totalk))`."""
    if totalk < 1:
        raise ValueError(f"totalk must be >= 1, got {totalk}")
    return (totalk - 1).bit_length()


def index_bytes(count: int, totalk: int) -> int:
    """Bytes taken by `count` packed indices of tiles of `totalk` coefficients."""
    return (count * index_bits(totalk) + 7) // 8


def effective_k(topk: int, totalk: int) -> int:
    """Coefficients kept per chunk: `clamp(topk, 1, totalk)`."""
    return max(1, min(topk, totalk))


def topk_per_chunk(encoded: torch.Tensor, topk: int, tile_dims: int) -> tuple[torch.Tensor, ...]:
    """Flatten the last `tile_dims` dims and keep the top-k |coef| per chunk.

    Returns `(idx, val)`, both `[chunks, k]`; idx is int64, val keeps `encoded.dtype`.
    """
    totalk = math.prod(encoded.shape[-tile_dims:])
    flat = encoded.reshape(-1, totalk)
    k = effective_k(topk, totalk)
    idx = torch.topk(flat.abs(), k, dim=-1, largest=True, sorted=True).indices
    return idx, torch.gather(flat, -1, idx)


def pack_indices(idx: torch.Tensor, totalk: int) -> bytes:
    """Bit-pack non-negative indices below `totalk`, `index_bits(totalk)` bits each."""
    width = index_bits(totalk)
    flat = idx.detach().to("cpu", torch.int64).reshape(-1).numpy()
    bits = (flat[:, None] >> np.arange(width, dtype=np.int64)) & 1
    return np.packbits(bits.astype(np.uint8).reshape(-1), bitorder="little").tobytes()


def unpack_indices(data: bytes, totalk: int, count: int) -> np.ndarray:
    """Inverse of `pack_indices`: `count` indices as a flat int64 array.

    Raises `ValueError` when `data` is not exactly `index_bytes(count, totalk)` long or a
    padding bit after the last index is set. Indices are not range-checked here (a width of
    12 bits can hold 4095 for a 43 x 64 tile); callers compare them with `totalk`.
    """
    width = index_bits(totalk)
    expected = index_bytes(count, totalk)
    if len(data) != expected:
        raise ValueError(f"index bytes ({len(data)}) do not hold exactly {count} indices")
    raw = np.frombuffer(data, dtype=np.uint8)
    used = count * width
    if used % 8 and int(raw[-1]) >> (used % 8):
        raise ValueError("padding bits after the last index are not zero")
    if width == 0:
        return np.zeros(count, dtype=np.int64)
    if width > _WINDOW_BITS:
        bits = np.unpackbits(raw, bitorder="little")[:used].reshape(count, width)
        return bits.astype(np.int64) @ np.left_shift(np.int64(1), np.arange(width))
    # every index lies inside the 4 bytes from the byte holding its first bit
    window = np.zeros(len(raw) + 3, dtype=np.uint64)
    window[: len(raw)] = raw
    first = np.arange(count, dtype=np.int64) * width
    byte, shift = first >> 3, (first & 7).astype(np.uint64)
    word = (
        window[byte]
        | window[byte + 1] << np.uint64(8)
        | window[byte + 2] << np.uint64(16)
        | window[byte + 3] << np.uint64(24)
    )
    return ((word >> shift) & np.uint64((1 << width) - 1)).astype(np.int64)
