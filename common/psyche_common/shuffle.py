"""Deterministic shuffling primitives shared by the coordinator and every client.

Owns the three primitives of the reference's section 3.4 that must agree bit for bit across
machines: the Knuth MMIX linear congruential generator (`Lcg`), the Fisher–Yates shuffle driven
by it (`deterministic_shuffle`), and the 90-round SHA-256 swap-or-not permutation
(`compute_shuffled_index`) used for committee and witness selection.
"""

from __future__ import annotations

import hashlib
from typing import TypeVar

import numpy as np

T = TypeVar("T")

U64_MASK = (1 << 64) - 1
LCG_MULTIPLIER = 6364136223846793005
LCG_INCREMENT = 1442695040888963407
SWAP_OR_NOT_ROUNDS = 90


class Lcg:
    """64-bit LCG with Knuth's MMIX constants; `next_u64` returns the new state."""

    def __init__(self, seed: int) -> None:
        self.state = seed & U64_MASK

    def next_u64(self) -> int:
        self.state = (self.state * LCG_MULTIPLIER + LCG_INCREMENT) & U64_MASK
        return self.state

    def next_range(self, upper: int) -> int:
        """A value in `0..upper` (exclusive) as `next_u64() % upper`."""
        if upper <= 0:
            raise ValueError(f"Lcg.next_range needs upper > 0, got {upper}")
        return self.next_u64() % upper


def deterministic_shuffle(items: list[T], seed: int) -> list[T]:
    """Return a new list: `items` shuffled by Fisher–Yates (last index first) with `Lcg(seed)`."""
    shuffled = list(items)
    rng = Lcg(seed)
    for i in range(len(shuffled) - 1, 0, -1):
        j = rng.next_range(i + 1)
        shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
    return shuffled


def _round_pivots(seed: bytes, count: int) -> list[int]:
    return [
        int.from_bytes(hashlib.sha256(seed + bytes([r])).digest()[:8], "little") % count
        for r in range(SWAP_OR_NOT_ROUNDS)
    ]


def compute_shuffled_index(index: int, count: int, seed: bytes) -> int:
    """Position of `index` in the swap-or-not permutation of `0..count-1` seeded by `seed`.

    `seed` is the 32-byte committee or witness seed. Raises ValueError when `index >= count`
    (the reference panics with "index < index_count").
    """
    if not 0 <= index < count:
        raise ValueError(f"compute_shuffled_index needs 0 <= index < count, got {index}, {count}")
    if len(seed) != 32:
        raise ValueError(f"compute_shuffled_index needs a 32-byte seed, got {len(seed)} bytes")
    current = index
    for round_number, pivot in enumerate(_round_pivots(seed, count)):
        flip = (pivot + count - current) % count
        position = max(current, flip)
        source = hashlib.sha256(
            seed + bytes([round_number]) + ((position // 256) & 0xFFFFFFFF).to_bytes(4, "little")
        ).digest()
        if (source[(position % 256) // 8] >> (position % 8)) & 1:
            current = flip
    return current


def shuffled_positions(count: int, seed: bytes) -> list[int]:
    """`compute_shuffled_index(i, count, seed)` for every `i`, vectorized with numpy.

    Equal to the element-wise calls: each round hashes the `ceil(count / 256)` source blocks
    once and moves all indices together, which makes whole-committee computations for
    thousands of nodes cheap.
    """
    if count <= 0:
        return []
    if len(seed) != 32:
        raise ValueError(f"shuffled_positions needs a 32-byte seed, got {len(seed)} bytes")
    num_blocks = (count - 1) // 256 + 1
    currents = np.arange(count, dtype=np.int64)
    for round_number, pivot in enumerate(_round_pivots(seed, count)):
        prefix = seed + bytes([round_number])
        source = b"".join(
            hashlib.sha256(prefix + (block & 0xFFFFFFFF).to_bytes(4, "little")).digest()
            for block in range(num_blocks)
        )
        bits = np.unpackbits(np.frombuffer(source, dtype=np.uint8), bitorder="little")
        flips = (pivot + count - currents) % count
        positions = np.maximum(currents, flips)
        currents = np.where(bits[positions] == 1, flips, currents)
    return currents.tolist()
