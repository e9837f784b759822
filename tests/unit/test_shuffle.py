"""LCG, deterministic Fisher–Yates and swap-or-not: golden vectors (spec §9) and the
reference's unit tests (spec §8.2, lcg.rs / deterministic_shuffle.rs / swap_or_not.rs)."""

from __future__ import annotations

import hashlib

import pytest
from psyche_common.shuffle import (
    Lcg,
    compute_shuffled_index,
    deterministic_shuffle,
    shuffled_positions,
)


def test_lcg_golden_vector() -> None:
    rng = Lcg(12345)
    assert [rng.next_u64() for _ in range(5)] == [
        2021368500568277588,
        4895494634720187923,
        16336879138292273062,
        15416634109187857277,
        6006832857977215304,
    ]


def test_lcg_initialization_and_next() -> None:
    rng = Lcg(42)
    assert rng.state == 42
    first, second = rng.next_u64(), rng.next_u64()
    assert first != second


def test_lcg_reproducibility() -> None:
    a, b = Lcg(987654321), Lcg(987654321)
    assert [a.next_u64() for _ in range(100)] == [b.next_u64() for _ in range(100)]


def test_lcg_next_range_bounds_and_distribution() -> None:
    rng = Lcg(7)
    draws = [rng.next_range(10) for _ in range(10_000)]
    assert all(0 <= d < 10 for d in draws)
    assert set(draws) == set(range(10))
    assert Lcg(3).next_range(1) == 0
    assert 0 <= Lcg(3).next_range(2**64 - 1) < 2**64 - 1


def test_lcg_next_range_zero_is_rejected() -> None:
    with pytest.raises(ValueError, match="upper > 0"):
        Lcg(1).next_range(0)


@pytest.mark.parametrize(
    ("items", "seed", "expected"),
    [
        (list(range(10)), 42, [2, 1, 0, 6, 7, 5, 4, 9, 8, 3]),
        ([1, 2, 3, 4, 5], 42, [2, 5, 3, 1, 4]),
        (list(range(10)), 0, [6, 3, 8, 5, 0, 9, 2, 1, 4, 7]),
    ],
)
def test_deterministic_shuffle_golden(items: list[int], seed: int, expected: list[int]) -> None:
    original = list(items)
    assert deterministic_shuffle(items, seed) == expected
    assert items == original  # the input is not modified


def test_deterministic_shuffle_properties() -> None:
    items = list(range(999))
    shuffled = deterministic_shuffle(items, 42)
    assert shuffled != items
    assert sorted(shuffled) == items
    assert deterministic_shuffle(items, 42) == shuffled
    assert deterministic_shuffle(items, 43) != shuffled
    assert deterministic_shuffle([], 1) == []
    assert deterministic_shuffle(["only"], 1) == ["only"]


def test_swap_or_not_golden_vectors() -> None:
    assert [compute_shuffled_index(i, 10, bytes(32)) for i in range(10)] == [
        9, 7, 4, 1, 8, 0, 5, 6, 3, 2,
    ]  # fmt: skip
    assert [compute_shuffled_index(i, 100, bytes([1] * 32)) for i in range(10)] == [
        57, 43, 2, 9, 75, 79, 41, 28, 67, 17,
    ]  # fmt: skip


def test_swap_or_not_is_a_permutation_and_deterministic() -> None:
    seed = hashlib.sha256(b"perm").digest()
    for count in (1, 2, 3, 17, 300):
        positions = [compute_shuffled_index(i, count, seed) for i in range(count)]
        assert sorted(positions) == list(range(count))
        assert positions == [compute_shuffled_index(i, count, seed) for i in range(count)]


def test_swap_or_not_different_seeds() -> None:
    assert compute_shuffled_index(5, 100, bytes([1] * 32)) != compute_shuffled_index(
        5, 100, bytes([2] * 32)
    )


def test_swap_or_not_out_of_bounds() -> None:
    with pytest.raises(ValueError, match="index < count"):
        compute_shuffled_index(10, 10, bytes(32))
    with pytest.raises(ValueError, match="32-byte seed"):
        compute_shuffled_index(0, 10, b"short")


def test_batched_positions_equal_single_calls() -> None:
    seed = hashlib.sha256(b"batched").digest()
    for count in (0, 1, 5, 257, 600):
        assert shuffled_positions(count, seed) == [
            compute_shuffled_index(i, count, seed) for i in range(count)
        ]
