"""The witness bloom filter (`WitnessBloom = Bloom<16, 8>` in the reference, section 5.2).

1024 bits stored LSB-first (bit `i` is word `i // 64`, bit `i % 64`; as bytes: byte `i // 8`,
bit `i % 8`), 8 u64 keys carried with the filter. Bit positions are keyed FNV-1a 64 (the key
replaces the offset basis) modulo the full bit count. The zero bloom (keys and bits all 0)
contains nothing.
"""

from __future__ import annotations

import random as _random
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

FNV_PRIME = 0x100000001B3
U64_MASK = (1 << 64) - 1
WITNESS_BLOOM_BITS = 1024
WITNESS_BLOOM_KEYS = 8


def fnv1a_keyed(key: int, data: bytes) -> int:
    """FNV-1a 64 over `data` with the initial state `key` instead of the offset basis."""
    h = key & U64_MASK
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & U64_MASK
    return h


@dataclass
class Bloom:
    """A bloom filter with explicit hash keys; defaults are the 1024-bit, 8-key witness bloom."""

    keys: tuple[int, ...] = (0,) * WITNESS_BLOOM_KEYS
    bits: int = 0
    num_bits: int = WITNESS_BLOOM_BITS

    def __post_init__(self) -> None:
        self.keys = tuple(int(k) for k in self.keys)
        if self.num_bits <= 0 or self.num_bits % 64:
            raise ValueError(
                f"Bloom num_bits must be a positive multiple of 64, got {self.num_bits}"
            )
        for key in self.keys:
            if not 0 <= key <= U64_MASK:
                raise ValueError(f"Bloom key {key} is not a u64")
        if not 0 <= self.bits < (1 << self.num_bits):
            raise ValueError(f"Bloom bits do not fit in {self.num_bits} bits")

    @classmethod
    def random(
        cls,
        source: _random.Random | Sequence[int] | None = None,
        num_keys: int = WITNESS_BLOOM_KEYS,
        num_bits: int = WITNESS_BLOOM_BITS,
    ) -> Bloom:
        """An empty bloom with fresh keys: from `source` (a Random, or the keys themselves),
        or from the OS's secure random source when `source` is None."""
        if source is None:
            keys: tuple[int, ...] = tuple(secrets.randbits(64) for _ in range(num_keys))
        elif isinstance(source, _random.Random):
            keys = tuple(source.getrandbits(64) for _ in range(num_keys))
        else:
            keys = tuple(source)
        return cls(keys=keys, num_bits=num_bits)

    def positions(self, item: bytes) -> list[int]:
        return [fnv1a_keyed(key, item) % self.num_bits for key in self.keys]

    def add(self, item: bytes) -> None:
        for position in self.positions(item):
            self.bits |= 1 << position

    def add_all(self, items: Iterable[bytes]) -> None:
        for item in items:
            self.add(item)

    def contains(self, item: bytes) -> bool:
        if not self.keys or not self.bits:
            return False
        return all((self.bits >> position) & 1 for position in self.positions(item))

    def __contains__(self, item: bytes) -> bool:
        return self.contains(item)

    def clear(self) -> None:
        self.bits = 0

    def bit_count(self) -> int:
        return self.bits.bit_count()

    def bits_bytes(self) -> bytes:
        return self.bits.to_bytes(self.num_bits // 8, "little")

    def to_wire(self) -> dict[str, Any]:
        """msgpack-safe form: `{"keys": [u64...], "bits": bytes (LSB-first)}`."""
        return {"keys": list(self.keys), "bits": self.bits_bytes()}

    @classmethod
    def from_wire(cls, data: Any, num_bits: int = WITNESS_BLOOM_BITS) -> Bloom:
        """Parse `to_wire` output; raises ValueError naming the bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"bloom must be a map, got {type(data).__name__}")
        keys = data.get("keys")
        bits = data.get("bits")
        if not isinstance(keys, list | tuple) or not all(
            isinstance(k, int) and not isinstance(k, bool) for k in keys
        ):
            raise ValueError("bloom.keys must be a list of integers")
        if not isinstance(bits, bytes | bytearray) or len(bits) != num_bits // 8:
            raise ValueError(f"bloom.bits must be {num_bits // 8} bytes")
        return cls(keys=tuple(keys), bits=int.from_bytes(bits, "little"), num_bits=num_bits)
