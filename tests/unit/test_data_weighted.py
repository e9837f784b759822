"""Weighted mixtures: interleave, exhaust-before-repeat, shuffling, config parsing, errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from psyche_common.batch_id import BatchId
from psyche_common.data.dummy import DummyDataProvider
from psyche_common.data.errors import DataFileError, DataIndexError
from psyche_common.data.weighted import (
    WeightedDataProvider,
    load_weighted_http,
    mixture_index,
    parse_weighted_config,
)

SEED = bytes(range(32))


class MockProvider:
    """Sample j of provider p is a row of ``p * 1000 + j``; records its requests."""

    def __init__(self, provider_id: int, size: int, seq_len: int = 4) -> None:
        self.provider_id = provider_id
        self.num_sequences = size
        self.seq_len = seq_len
        self.requests: list[BatchId] = []
        self.closed = False

    async def get_samples(self, batch: BatchId) -> np.ndarray:
        assert batch.end < self.num_sequences
        self.requests.append(batch)
        ids = np.arange(batch.start, batch.end + 1, dtype=np.int64) + self.provider_id * 1000
        return np.repeat(ids[:, None], self.seq_len, axis=1)

    async def aclose(self) -> None:
        self.closed = True


def sources(samples: np.ndarray) -> list[tuple[int, int]]:
    return [(int(v) // 1000, int(v) % 1000) for v in samples[:, 0]]


async def test_closing_the_mixture_closes_every_provider() -> None:
    providers = [MockProvider(1, 10), MockProvider(2, 10)]
    mix = WeightedDataProvider(providers, [1, 1])
    await mix.aclose()
    assert [p.closed for p in providers] == [True, True]


def test_equal_weights_interleave_lowest_index_first() -> None:
    providers, local = mixture_index([4, 4], [1.0, 1.0])
    assert providers.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert local.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


async def test_equal_weights_seeded() -> None:
    mix = WeightedDataProvider([MockProvider(1, 100), MockProvider(2, 100)], [0.5, 0.5], SEED)
    assert mix.num_sequences == 200
    counts = Counter(p for p, _ in sources(await mix.get_samples(BatchId(0, 99))))
    assert 40 <= counts[1] <= 60 and counts[1] + counts[2] == 100


async def test_unequal_and_length_weights() -> None:
    mix = WeightedDataProvider([MockProvider(1, 100), MockProvider(2, 100)], [0.75, 0.25], SEED)
    counts = Counter(p for p, _ in sources(await mix.get_samples(BatchId(0, 99))))
    assert 65 <= counts[1] <= 85 and 15 <= counts[2] <= 35
    auto = WeightedDataProvider([MockProvider(1, 100), MockProvider(2, 300)], None, SEED)
    assert auto.num_sequences == 400
    counts = Counter(p for p, _ in sources(await auto.get_samples(BatchId(0, 99))))
    assert 15 <= counts[1] <= 35 and 65 <= counts[2] <= 85


async def test_same_seed_same_order_and_batches_are_disjoint() -> None:
    def build() -> WeightedDataProvider:
        return WeightedDataProvider([MockProvider(1, 50), MockProvider(2, 50)], [1, 1], SEED)

    one, two = build(), build()
    first = await one.get_samples(BatchId(0, 9))
    assert first.tolist() == (await two.get_samples(BatchId(0, 9))).tolist()
    second = await one.get_samples(BatchId(10, 19))
    assert not set(sources(first)) & set(sources(second))
    assert (await one.get_samples(BatchId(0, 9))).tolist() == first.tolist()


async def test_exhaustive_mixture_uses_every_sample_once() -> None:
    mix = WeightedDataProvider([MockProvider(1, 5), MockProvider(2, 5)], [1, 1], SEED)
    got = sources(await mix.get_samples(BatchId(0, 9)))
    assert sorted(got) == [(p, j) for p in (1, 2) for j in range(5)]


async def test_small_dataset_exhausts_before_repeating() -> None:
    small, large = MockProvider(1, 5), MockProvider(2, 20)
    mix = WeightedDataProvider([small, large], [0.5, 0.5])
    assert mix.num_sequences == 25
    got = sources(await mix.get_samples(BatchId(0, 24)))
    from_small = [j for p, j in got if p == 1]
    from_large = [j for p, j in got if p == 2]
    assert len(from_small) == 13 and len(from_large) == 12
    assert from_small[:5] == [0, 1, 2, 3, 4] and set(from_small) == set(range(5))
    assert len(set(from_large)) == len(from_large)


async def test_contiguous_local_runs_are_fetched_together() -> None:
    one, two = MockProvider(1, 10), MockProvider(2, 10)
    mix = WeightedDataProvider([one, two], [1, 1])
    await mix.get_samples(BatchId(0, 5))
    assert one.requests == [BatchId(0, 2)] and two.requests == [BatchId(0, 2)]


async def test_out_of_range_is_an_error_not_provider_zero() -> None:
    mix = WeightedDataProvider([MockProvider(1, 3), MockProvider(2, 3)], [1, 1])
    with pytest.raises(DataIndexError, match="index 6 is out of bounds: the mixture has 6"):
        await mix.get_samples(BatchId(5, 6))


async def test_with_dummy_providers() -> None:
    mix = WeightedDataProvider(
        [DummyDataProvider(10, 50), DummyDataProvider(10, 50)], [0.5, 0.5], SEED
    )
    assert mix.num_sequences == 100
    assert (await mix.get_samples(BatchId(0, 9))).shape == (10, 10)


def test_invalid_mixtures() -> None:
    with pytest.raises(DataFileError, match="at least one non-empty"):
        mixture_index([0, 5], [1.0, 0.0])
    with pytest.raises(DataFileError, match="finite and >= 0"):
        mixture_index([5, 5], [1.0, -1.0])
    with pytest.raises(DataFileError, match="2 providers but 1 weights"):
        mixture_index([5, 5], [1.0])
    with pytest.raises(DataFileError, match="must know its number of sequences"):
        WeightedDataProvider([DummyDataProvider(4)], None)
    with pytest.raises(DataFileError, match="disagree on sequence length"):
        WeightedDataProvider([MockProvider(1, 3, 4), MockProvider(2, 3, 5)])


def test_empty_provider_is_skipped() -> None:
    providers, local = mixture_index([0, 3], [1.0, 1.0])
    assert providers.tolist() == [1, 1, 1] and local.tolist() == [0, 1, 2]


def test_large_mixture_is_fast_and_proportional() -> None:
    providers, _ = mixture_index([600_000, 400_000], [0.3, 0.7])
    counts = np.bincount(providers)
    assert abs(counts[0] - 300_000) <= 1 and abs(counts[1] - 700_000) <= 1


LOCATION = {
    "location": {"SingleUrl": "http://127.0.0.1:1/a.ds"},
    "token_size_in_bytes": "TwoBytes",
    "shuffle": "DontShuffle",
}


def test_parse_weighted_config_forms() -> None:
    sources_, weights, shuffle = parse_weighted_config(
        {"shuffle": {"Seeded": [1] * 32}, "providers": [[LOCATION, 0.7], [LOCATION, 0.3]]}
    )
    assert len(sources_) == 2 and weights == [0.7, 0.3] and shuffle == bytes([1] * 32)
    sources_, weights, shuffle = parse_weighted_config(
        {"shuffle": "DontShuffle", "providers": [LOCATION]}
    )
    assert len(sources_) == 1 and weights is None and shuffle is None


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"providers": [LOCATION]}, "exactly 'shuffle' and 'providers'"),
        ({"shuffle": "DontShuffle", "providers": []}, "non-empty list"),
        ({"shuffle": "DontShuffle", "providers": [[LOCATION, 1], LOCATION]}, "not a mix"),
        ({"shuffle": "DontShuffle", "providers": [[LOCATION, "x"]]}, "weight must be a number"),
        ({"shuffle": "DontShuffle", "providers": [{"location": {}}]}, r"providers\[0\] is not"),
    ],
)
def test_parse_weighted_config_errors(document: dict[str, object], message: str) -> None:
    with pytest.raises(DataFileError, match=message):
        parse_weighted_config(document)


async def test_an_invalid_mixture_config_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "mixture.json"
    config.write_text('{"shuffle": "DontShuffle", "providers": []}')
    with pytest.raises(DataFileError, match=f"mixture config {config}: 'providers' must be"):
        await load_weighted_http(str(config), 4)
