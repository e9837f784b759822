"""make_provider: every data_location variant, the Server hook, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from psyche_common.batch_id import BatchId
from psyche_common.config.data_location import DummyData, LocalData
from psyche_common.data import DataFileError, DataProvider
from psyche_common.data.builtin import BuiltinDataProvider
from psyche_common.data.dummy import DummyDataProvider
from psyche_common.data.factory import make_provider, parse_data_location
from psyche_common.data.local import LocalDataProvider
from psyche_common.data.preprocessed import PreprocessedDataProvider


async def test_dummy_uses_the_model_sequence_length() -> None:
    provider = await make_provider("Dummy", 512)
    assert isinstance(provider, DummyDataProvider) and isinstance(provider, DataProvider)
    assert (await provider.get_samples(BatchId(0, 1))).shape == (2, 512)
    assert isinstance(await make_provider(DummyData(), 8), DummyDataProvider)


async def test_local_directory_and_metadata_token_size(tmp_path: Path) -> None:
    np.arange(40, dtype="<u4").tofile(tmp_path / "a.bin")
    (tmp_path / "metadata.json").write_text(json.dumps({"token_size": 4}))
    provider = await make_provider({"Local": str(tmp_path)}, 10)
    assert isinstance(provider, LocalDataProvider) and provider.num_sequences == 4
    assert isinstance(provider, DataProvider)
    assert (await provider.get_samples(BatchId(3, 3))).tolist() == [list(range(30, 40))]
    assert isinstance(await make_provider(LocalData(path=str(tmp_path)), 10), LocalDataProvider)


async def test_local_data_toml_matches_the_data_server(tmp_path: Path) -> None:
    data = tmp_path / "tokens"
    data.mkdir()
    np.arange(100, dtype="<u2").tofile(data / "a.ds")
    seed = list(range(32))
    toml = tmp_path / "data.toml"
    toml.write_text(
        f'dir = "tokens"\ntoken_size = "TwoBytes"\nseq_len = 10\nshuffle_seed = {seed}\n'
    )
    provider = await make_provider({"Local": str(toml)}, 10)
    server_side = LocalDataProvider(data, "TwoBytes", 10, bytes(seed))
    assert (await provider.get_samples(BatchId(0, 9))).tolist() == (
        await server_side.get_samples(BatchId(0, 9))
    ).tolist()
    with pytest.raises(DataFileError, match="seq_len 10 but the model's max_seq_len is 20"):
        await make_provider({"Local": str(toml)}, 20)


async def test_server_location_uses_the_injected_client() -> None:
    calls: list[tuple[str, int, Any, str | None]] = []

    async def connect(address: str, seq_len: int, identity: Any, run_id: str | None) -> Any:
        calls.append((address, seq_len, identity, run_id))
        return DummyDataProvider(seq_len)

    provider = await make_provider(
        {"Server": "127.0.0.1:20001"}, 16, identity="me", run_id="r", server_provider=connect
    )
    assert calls == [("127.0.0.1:20001", 16, "me", "r")] and provider.seq_len == 16
    with pytest.raises(ValueError, match="needs the client's identity"):
        await make_provider({"Server": "127.0.0.1:20001"}, 16, run_id="r")
    with pytest.raises(ValueError, match="needs the run id"):
        await make_provider({"Server": "127.0.0.1:20001"}, 16, identity="me")


async def test_server_location_defaults_to_the_data_server_client() -> None:
    from psyche_common.data.server_client import DataServerProvider
    from psyche_common.protocol import Identity

    provider = await make_provider(
        {"Server": "127.0.0.1:20001"}, 16, identity=Identity.generate(), run_id="r"
    )
    assert isinstance(provider, DataServerProvider) and isinstance(provider, DataProvider)
    assert provider.seq_len == 16  # replies of any other length are refused
    assert provider.run_id == "r"  # its handshake names the run
    await provider.aclose()


async def test_builtin_and_preprocessed(tmp_path: Path) -> None:
    provider = await make_provider({"Builtin": "python-stdlib"}, 32, cache_dir=tmp_path)
    assert isinstance(provider, BuiltinDataProvider) and isinstance(provider, DataProvider)
    await provider.aclose()
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "ds").mkdir()
    pq.write_table(pa.table({"inputs": [[1, 2], [3, 4]]}), tmp_path / "ds" / "train.parquet")
    parquet = await make_provider({"Preprocessed": str(tmp_path / "ds")}, 2)
    assert isinstance(parquet, PreprocessedDataProvider) and parquet.num_sequences == 2
    assert isinstance(parquet, DataProvider)
    await parquet.aclose()


async def test_invalid_locations() -> None:
    with pytest.raises(DataFileError, match="invalid data_location"):
        await make_provider({"Nope": "x"}, 8)
    with pytest.raises(DataFileError, match="invalid data_location"):
        parse_data_location(42)
    with pytest.raises(DataFileError, match="sequence length must be positive"):
        await make_provider("Dummy", 0)
