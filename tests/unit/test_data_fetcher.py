"""SampleFetcher: one lazy provider build, retries with its policy, clear errors, closing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from psyche_common.batch_id import BatchId
from psyche_common.data import DataFetchError, DataFileError, DataIndexError, RetryPolicy
from psyche_common.data.fetcher import DataSource, SampleFetcher
from psyche_common.data.local import LocalDataProvider

QUICK = RetryPolicy(attempts=3, delay_step=0.0)


class ScriptedProvider:
    """Fails ``failures`` times with ``error``, then serves rows of ``start + column``."""

    def __init__(self, seq_len: int, failures: int = 0, error: Exception | None = None) -> None:
        self.seq_len = seq_len
        self.num_sequences: int | None = 100
        self.failures = failures
        self.error = error or DataFetchError("connection reset")
        self.calls = 0
        self.closed = False

    async def get_samples(self, batch: BatchId) -> np.ndarray:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        if batch.end >= 100:
            raise DataIndexError(f"index {batch.end} is out of bounds")
        rows = np.arange(batch.start, batch.end + 1, dtype=np.int64)[:, None]
        return rows + np.arange(self.seq_len, dtype=np.int64)

    async def aclose(self) -> None:
        self.closed = True


class ServerFactory:
    """A ``server_provider`` that records its calls and hands out one ScriptedProvider."""

    def __init__(self, provider: ScriptedProvider, fail_first: bool = False) -> None:
        self.provider = provider
        self.fail_first = fail_first
        self.calls: list[tuple[str, int, Any]] = []

    async def __call__(
        self, address: str, seq_len: int, identity: Any, run_id: str | None
    ) -> ScriptedProvider:
        self.calls.append((address, seq_len, identity))
        await asyncio.sleep(0.01)  # let concurrent fetches pile up on the build
        if self.fail_first and len(self.calls) == 1:
            raise DataFileError(f"data server address {address!r} is not host:port")
        return self.provider


SERVER = DataSource({"Server": "127.0.0.1:20001"}, 8)


async def test_the_provider_is_built_once_for_concurrent_fetches() -> None:
    factory = ServerFactory(ScriptedProvider(8))
    fetcher = SampleFetcher(SERVER, identity="me", policy=QUICK, server_provider=factory)
    results = await asyncio.gather(*(fetcher(BatchId(i, i + 1)) for i in range(5)))
    assert factory.calls == [("127.0.0.1:20001", 8, "me")]  # seq_len and identity passed on
    assert [r[:, 0].tolist() for r in results] == [[i, i + 1] for i in range(5)]
    assert results[0].shape == (2, 8) and results[0].dtype == np.int64


async def test_the_source_is_read_at_the_first_fetch() -> None:
    reads: list[int] = []

    def source() -> DataSource:
        reads.append(1)
        return DataSource("Dummy", 16)

    fetcher = SampleFetcher(source, identity=None, policy=QUICK)
    assert reads == []
    assert (await fetcher(BatchId(0, 2))).shape == (3, 16)
    await fetcher(BatchId(3, 3))
    assert reads == [1]


async def test_transient_failures_are_retried_with_the_policy() -> None:
    provider = ScriptedProvider(4, failures=2)
    fetcher = SampleFetcher(SERVER, "me", QUICK, server_provider=ServerFactory(provider))
    assert (await fetcher(BatchId(5, 5))).tolist() == [[5, 6, 7, 8]]
    assert provider.calls == 3


async def test_exhausted_attempts_raise_a_final_fetch_error_naming_the_batch() -> None:
    provider = ScriptedProvider(4, failures=10)
    fetcher = SampleFetcher(SERVER, "me", QUICK, server_provider=ServerFactory(provider))
    with pytest.raises(DataFetchError, match=r"samples B\[3, 7\] failed after 3 attempts") as info:
        await fetcher(BatchId(3, 7))
    assert info.value.retryable is False
    assert provider.calls == 3


async def test_permanent_failures_are_not_retried() -> None:
    provider = ScriptedProvider(4)
    fetcher = SampleFetcher(SERVER, "me", QUICK, server_provider=ServerFactory(provider))
    with pytest.raises(DataIndexError, match="index 100 is out of bounds"):
        await fetcher(BatchId(99, 100))
    assert provider.calls == 1
    refused = ScriptedProvider(4, failures=5, error=DataFetchError("HTTP 404", retryable=False))
    fetcher = SampleFetcher(SERVER, "me", QUICK, server_provider=ServerFactory(refused))
    with pytest.raises(DataFetchError, match="HTTP 404"):
        await fetcher(BatchId(0, 0))
    assert refused.calls == 1


async def test_a_failed_build_is_tried_again_at_the_next_fetch() -> None:
    factory = ServerFactory(ScriptedProvider(8), fail_first=True)
    fetcher = SampleFetcher(SERVER, "me", QUICK, server_provider=factory)
    with pytest.raises(DataFileError, match="is not host:port"):
        await fetcher(BatchId(0, 0))
    assert (await fetcher(BatchId(1, 1))).shape == (1, 8)
    assert len(factory.calls) == 2


async def test_a_bad_location_is_a_data_file_error() -> None:
    fetcher = SampleFetcher(DataSource({"Nope": "x"}, 8), identity=None, policy=QUICK)
    with pytest.raises(DataFileError, match="invalid data_location"):
        await fetcher(BatchId(0, 0))


async def test_aclose_closes_the_provider_and_refuses_later_fetches() -> None:
    provider = ScriptedProvider(4)
    fetcher = SampleFetcher(SERVER, "me", QUICK, server_provider=ServerFactory(provider))
    await fetcher(BatchId(0, 0))
    await fetcher.aclose()
    await fetcher.aclose()
    assert provider.closed
    with pytest.raises(DataFetchError, match="the sample fetcher is closed") as info:
        await fetcher(BatchId(0, 0))
    assert info.value.retryable is False


async def test_aclose_before_any_fetch_builds_nothing() -> None:
    factory = ServerFactory(ScriptedProvider(4))
    fetcher = SampleFetcher(SERVER, "me", QUICK, server_provider=factory)
    await fetcher.aclose()
    assert factory.calls == []


async def test_local_data_through_the_fetcher(tmp_path: Path) -> None:
    np.arange(200, dtype="<u2").tofile(tmp_path / "a.bin")
    fetcher = SampleFetcher(DataSource({"Local": str(tmp_path)}, 10), identity=None)
    try:
        samples = await fetcher(BatchId(4, 6))
    finally:
        await fetcher.aclose()
    expected = LocalDataProvider(tmp_path, "TwoBytes", 10).read(BatchId(4, 6))
    np.testing.assert_array_equal(samples, expected)
