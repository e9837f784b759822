"""The witness bloom: keyed FNV-1a golden vectors (spec §9) and bloom.rs's unit tests."""

from __future__ import annotations

import hashlib
import random

import msgpack
import pytest
from psyche_common.bloom import FNV_PRIME, Bloom, fnv1a_keyed

ABC_HASH = hashlib.sha256(b"abc").digest()


def test_fnv_keyed_golden() -> None:
    assert fnv1a_keyed(0, ABC_HASH) == 8374688084997375308
    assert fnv1a_keyed(0xCBF29CE484222325, b"a") == 0xAF63DC4C8601EC8C
    assert FNV_PRIME == 0x100000001B3


def test_bloom_positions_golden() -> None:
    bloom = Bloom(keys=tuple(range(1, 9)))
    assert bloom.positions(ABC_HASH) == [225, 210, 663, 672, 149, 6, 187, 388]
    bloom.add(ABC_HASH)
    assert bloom.bit_count() == 8
    # LSB-first layout: bit 6 is the 7th bit of the first byte.
    assert bloom.bits_bytes()[0] == 1 << 6


def test_bloom_new_keeps_keys() -> None:
    keys = (11, 22, 33, 44, 55, 66, 77, 88)
    assert Bloom(keys=keys).keys == keys


def test_bloom_add_and_contains_small() -> None:
    bloom = Bloom(keys=(1, 2), num_bits=512)  # the reference's Bloom<8, 2>
    bloom.add(b"hello")
    assert bloom.contains(b"hello")
    assert not bloom.contains(b"world")


def test_bloom_clear() -> None:
    bloom = Bloom.random(random.Random(1))
    bloom.add(b"x")
    bloom.clear()
    assert not bloom.contains(b"x")
    assert bloom.bit_count() == 0


def test_bloom_multiple_items() -> None:
    bloom = Bloom(keys=(5, 6, 7), num_bits=1024)  # the reference's Bloom<16, 3>
    for item in (b"\x01\x02\x03", b"\x04\x05\x06", b"\x07\x08\x09"):
        bloom.add(item)
    for item in (b"\x01\x02\x03", b"\x04\x05\x06", b"\x07\x08\x09"):
        assert item in bloom
    assert not bloom.contains(bytes([1, 4, 7]))


def test_zero_bloom_contains_nothing() -> None:
    bloom = Bloom()
    assert bloom.keys == (0,) * 8
    assert not bloom.contains(b"")
    assert not bloom.contains(ABC_HASH)


def test_random_keys_sources() -> None:
    assert Bloom.random(random.Random(5)).keys == Bloom.random(random.Random(5)).keys
    assert Bloom.random([1, 2, 3, 4, 5, 6, 7, 8]).keys == (1, 2, 3, 4, 5, 6, 7, 8)
    assert len(Bloom.random().keys) == 8


def test_wire_round_trip_through_msgpack() -> None:
    bloom = Bloom.random(random.Random(9))
    for i in range(50):
        bloom.add(hashlib.sha256(bytes([i])).digest())
    wire = msgpack.unpackb(msgpack.packb(bloom.to_wire()), raw=False)
    assert isinstance(wire["bits"], bytes) and len(wire["bits"]) == 128
    assert Bloom.from_wire(wire) == bloom


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([], "must be a map"),
        ({"keys": "no", "bits": bytes(128)}, "keys"),
        ({"keys": [1] * 8, "bits": bytes(3)}, "128 bytes"),
        ({"keys": [-1] * 8, "bits": bytes(128)}, "u64"),
    ],
)
def test_from_wire_rejects_bad_input(bad: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Bloom.from_wire(bad)
