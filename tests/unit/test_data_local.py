"""Local, dummy providers and the retry helper."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from psyche_common.batch_id import BatchId
from psyche_common.data.dummy import DummyDataProvider
from psyche_common.data.errors import DataFetchError, DataFileError, DataIndexError
from psyche_common.data.local import LocalDataProvider
from psyche_common.data.retry import RetryPolicy, get_samples_with_retries, retry_async

SEED = bytes(range(1, 33))


def write_tokens(path: Path, tokens: range | list[int], dtype: str = "<u2") -> Path:
    path.write_bytes(np.asarray(list(tokens), dtype=dtype).tobytes())
    return path


async def test_local_provider_reads_every_full_sequence(tmp_path: Path) -> None:
    write_tokens(tmp_path / "00.ds", range(12))  # exactly 3 sequences of 4: all used
    write_tokens(tmp_path / "01.ds", range(100, 102))  # shorter than a sequence: none
    provider = LocalDataProvider(tmp_path, "TwoBytes", 4)
    assert provider.num_sequences == 3
    samples = await provider.get_samples(BatchId(0, 2))
    assert samples.dtype == np.int64
    assert samples.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(DataIndexError, match="index 3 is out of bounds: the data has 3 sequences"):
        await provider.get_samples(BatchId(2, 3))


async def test_local_provider_four_bytes_and_seeded_shuffle(tmp_path: Path) -> None:
    write_tokens(tmp_path / "a.bin", range(70000, 70040), "<u4")
    plain = LocalDataProvider(tmp_path, 4, 4)
    one = LocalDataProvider(tmp_path, "FourBytes", 4, {"Seeded": list(SEED)})
    two = LocalDataProvider(tmp_path, "FourBytes", 4, SEED)
    a = await one.get_samples(BatchId(0, 9))
    assert a.tolist() == (await two.get_samples(BatchId(0, 9))).tolist()
    assert a.tolist() != (await plain.get_samples(BatchId(0, 9))).tolist()
    assert sorted(a.tolist()) == (await plain.get_samples(BatchId(0, 9))).tolist()
    assert a.min() >= 70000


def test_local_provider_empty_dir_and_wrong_size(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="No training data files in directory"):
        LocalDataProvider(tmp_path, "TwoBytes", 4)
    write_tokens(tmp_path / "a.bin", range(3))
    with pytest.raises(DataFileError, match=r"a\.bin is 6 bytes.*wrong token size"):
        LocalDataProvider(tmp_path, "FourBytes", 4)


def test_local_provider_iterates_in_order(tmp_path: Path) -> None:
    write_tokens(tmp_path / "a.bin", range(8))
    assert [s.tolist() for s in LocalDataProvider(tmp_path, 2, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("name", ["fineweb", "dolma"])
async def test_reference_fixtures_decode_exactly(shared_fixtures: Path, name: str) -> None:
    data = shared_fixtures / "data"
    tokenizer = tokenizers.Tokenizer.from_file(str(data / "llama2_tokenizer.json"))
    provider = LocalDataProvider(data / name / "data", "TwoBytes", 2048)
    assert provider.num_sequences == 3  # the reference uses only 2 of the 3
    samples = await provider.get_samples(BatchId(0, 1))
    for index in (0, 1):
        expected = (data / name / "decoded" / f"{index}.txt").read_bytes().decode("utf-8")
        decoded = tokenizer.decode(samples[index].tolist(), skip_special_tokens=True)
        assert decoded == expected


async def test_dummy_provider_zeros_and_bounds() -> None:
    provider = DummyDataProvider(seq_len=16, num_sequences=10)
    samples = await provider.get_samples(BatchId(3, 9))
    assert samples.shape == (7, 16) and samples.dtype == np.int64 and not samples.any()
    with pytest.raises(DataIndexError, match="index 10 is out of bounds"):
        await provider.get_samples(BatchId(9, 10))
    unbounded = DummyDataProvider(seq_len=5)
    assert (await unbounded.get_samples(BatchId(10**12, 10**12 + 1))).shape == (2, 5)
    with pytest.raises(ValueError, match="positive"):
        DummyDataProvider(seq_len=0)


def test_retry_policy_schedule() -> None:
    policy = RetryPolicy()
    assert [policy.delay_before(k) for k in range(1, 8)] == [0, 2, 4, 6, 8, 10, 12]
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


async def test_retry_async_retries_transient_then_succeeds() -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise DataFetchError("temporarily down")
        return "ok"

    assert await retry_async(flaky, RetryPolicy(attempts=5, delay_step=0.001), "flaky") == "ok"
    assert calls == 3


async def test_retry_async_gives_up_and_does_not_retry_permanent() -> None:
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError("refused")

    with pytest.raises(DataFetchError, match="down failed after 3 attempts: refused") as info:
        await retry_async(down, RetryPolicy(attempts=3, delay_step=0), "down")
    assert calls == 3 and info.value.retryable is False

    async def missing() -> None:
        nonlocal calls
        calls += 1
        raise DataIndexError("index 9 is out of bounds")

    calls = 0
    with pytest.raises(DataIndexError):
        await retry_async(missing, RetryPolicy(attempts=3, delay_step=0), "missing")
    assert calls == 1


async def test_get_samples_with_retries_waits_between_attempts() -> None:
    class FlakyProvider:
        seq_len = 2
        num_sequences = None

        def __init__(self) -> None:
            self.calls = 0

        async def get_samples(self, batch: BatchId) -> np.ndarray:
            self.calls += 1
            if self.calls == 1:
                raise TimeoutError("slow")
            return np.ones((len(batch), 2), dtype=np.int64)

    provider = FlakyProvider()
    loop = asyncio.get_running_loop()
    started = loop.time()
    samples = await get_samples_with_retries(provider, BatchId(0, 1), RetryPolicy(3, 0.05))
    assert samples.shape == (2, 2) and provider.calls == 2
    assert loop.time() - started >= 0.05
