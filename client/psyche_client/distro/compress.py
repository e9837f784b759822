"""Top-k selection per chunk and the byte packing of indices and values.

Reference: spec section 1.4. `topk_per_chunk` flattens each n1 x n2 tile row-major (index
i = b * n2 + d) and keeps the k coefficients of largest magnitude with their signed values.
Indices are packed little-endian with a width that depends only on `totalk` (the tile size):
u8 up to 256, u16 up to 65536, u32 up to 2^32, else u64. Values travel either as bf16
(little-endian) or as 1 bit each: the sign bit (negative, -0.0 included, is 1), packed
LSB-first (element 8i+j is bit j of byte i), zero-padded to whole bytes. The receiver maps
bit 1 to -1 and bit 0 to +1, so a coefficient of exactly +0 arrives as +1.

API: `topk_per_chunk(encoded, topk) -> (idx int64 [chunks, k], val [chunks, k])`,
`index_width(totalk)`, `pack_indices`, `unpack_indices`, `pack_bf16`, `unpack_bf16`,
`pack_signs`, `unpack_signs`, `payload_sizes(...)` (the section 1.10 byte formula).
"""

from __future__ import annotations

import math

import numpy as np
import torch

_INDEX_DTYPES: dict[int, str] = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}


def index_width(totalk: int) -> int:
    """Bytes per packed index for tiles of `totalk` coefficients."""
    if totalk < 1:
        raise ValueError(f"totalk must be >= 1, got {totalk}")
    if totalk <= 256:
        return 1
    if totalk <= 65536:
        return 2
    if totalk <= 2**32:
        return 4
    return 8


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
    """Little-endian packing of non-negative indices with `index_width(totalk)` bytes each."""
    dtype = _INDEX_DTYPES[index_width(totalk)]
    return idx.detach().to("cpu", torch.int64).numpy().astype(dtype).tobytes()


def unpack_indices(data: bytes, totalk: int) -> np.ndarray:
    """Inverse of `pack_indices` (flat int64 array); `len(data)` must be a whole count."""
    width = index_width(totalk)
    if len(data) % width:
        raise ValueError(f"index bytes ({len(data)}) are not a multiple of the width {width}")
    return np.frombuffer(data, dtype=_INDEX_DTYPES[width]).astype(np.int64)


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


def value_bytes(count: int, one_bit: bool) -> int:
    """Bytes taken by `count` transmitted values."""
    return (count + 7) // 8 if one_bit else 2 * count


def payload_sizes(chunks: int, totalk: int, topk: int, one_bit: bool) -> tuple[int, int]:
    """Section 1.10 formula for one tensor: `(idx_bytes, val_bytes)`."""
    k = effective_k(topk, totalk)
    return chunks * k * index_width(totalk), value_bytes(chunks * k, one_bit)
