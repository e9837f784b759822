"""Preprocessed parquet provider: split selection, columns, validation errors, wraparound."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psyche_common.batch_id import BatchId
from psyche_common.data.errors import DataFileError
from psyche_common.data.preprocessed import PreprocessedDataProvider, find_parquet_files


def write_rows(path: Path, rows: list[list[int]], **extra: list[list[int]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {"inputs": pa.array(rows, type=pa.list_(pa.int32()))}
    for name, values in extra.items():
        columns[name] = pa.array(values, type=pa.large_list(pa.int64()))
    pq.write_table(pa.table(columns), path)
    return path


def test_split_selection_layouts(tmp_path: Path) -> None:
    write_rows(tmp_path / "converter" / "default" / "train" / "0000.parquet", [[1]])
    write_rows(tmp_path / "converter" / "default" / "test" / "0000.parquet", [[2]])
    write_rows(tmp_path / "converter" / "other" / "train" / "0000.parquet", [[3]])
    files = find_parquet_files(tmp_path / "converter", "train", subset="default")
    assert [p.parent.parent.name for p in files] == ["default"]
    assert len(find_parquet_files(tmp_path / "converter", "train")) == 2
    write_rows(tmp_path / "adhoc" / "data" / "train-00001-of-00002.parquet", [[1]])
    write_rows(tmp_path / "adhoc" / "data" / "train-00000-of-00002.parquet", [[1]])
    write_rows(tmp_path / "adhoc" / "data" / "test-00000-of-00001.parquet", [[1]])
    names = [p.name for p in find_parquet_files(tmp_path / "adhoc", "train")]
    assert names == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    assert len(find_parquet_files(tmp_path / "adhoc", None)) == 3
    with pytest.raises(DataFileError, match="Could not determine split 'validation'"):
        find_parquet_files(tmp_path / "adhoc", "validation")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFileError, match="No files in dataset"):
        find_parquet_files(tmp_path / "empty")


async def test_rows_wrap_around_and_all_columns(tmp_path: Path) -> None:
    write_rows(
        tmp_path / "train.parquet",
        [[1, 2, 3], [4, 5, 6]],
        labels=[[-100, 2, 3], [-100, -100, 6]],
        sequence_lengths=[[3], [1, 2]],
    )
    provider = PreprocessedDataProvider(tmp_path, 3)
    assert provider.num_sequences == 2
    samples = await provider.get_samples(BatchId(1, 4))
    assert samples.dtype == np.int64
    assert samples.tolist() == [[4, 5, 6], [1, 2, 3], [4, 5, 6], [1, 2, 3]]
    batch = provider.get_batch(BatchId(0, 1))
    assert batch.labels is not None and batch.labels.tolist() == [[-100, 2, 3], [-100, -100, 6]]
    assert batch.position_ids is None
    assert [s.tolist() for s in batch.sequence_lengths or []] == [[3], [1, 2]]


def test_seeded_shuffle_permutes_rows(tmp_path: Path) -> None:
    rows = [[i, i] for i in range(50)]
    write_rows(tmp_path / "train.parquet", rows)
    shuffled = PreprocessedDataProvider(tmp_path, 2, {"Seeded": [7] * 32})
    assert shuffled.inputs.tolist() != rows and sorted(shuffled.inputs.tolist()) == rows


def test_column_errors(tmp_path: Path) -> None:
    write_rows(tmp_path / "a" / "train.parquet", [[1, 2], [3]])
    with pytest.raises(DataFileError, match=r"`inputs` has length 1 instead of 2 \(row 1\)"):
        PreprocessedDataProvider(tmp_path / "a", 2)
    write_rows(tmp_path / "b" / "train.parquet", [[1, 2]], labels=[[1]])
    with pytest.raises(DataFileError, match="`labels` has length 1 instead of 2"):
        PreprocessedDataProvider(tmp_path / "b", 2)
    (tmp_path / "c").mkdir()
    pq.write_table(pa.table({"text": ["hi"]}), tmp_path / "c" / "train.parquet")
    with pytest.raises(DataFileError, match="Dataset does not have `inputs` column"):
        PreprocessedDataProvider(tmp_path / "c", 2)
    (tmp_path / "d").mkdir()
    pq.write_table(
        pa.table({"inputs": pa.array([[1.5, 2.5]], type=pa.list_(pa.float32()))}),
        tmp_path / "d" / "train.parquet",
    )
    with pytest.raises(DataFileError, match="not integers"):
        PreprocessedDataProvider(tmp_path / "d", 2)
    write_rows(tmp_path / "e" / "train.parquet", [])
    with pytest.raises(DataFileError, match="Empty dataset"):
        PreprocessedDataProvider(tmp_path / "e", 2)


async def test_missing_location_tries_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def fake_download(repo_id: str) -> Path:
        calls.append(repo_id)
        write_rows(tmp_path / "dl" / "train-0.parquet", [[9, 9]])
        return tmp_path / "dl"

    monkeypatch.setattr("psyche_common.data.preprocessed.download_dataset", fake_download)
    provider = await PreprocessedDataProvider.from_location("org/dataset", 2)
    assert calls == ["org/dataset"] and provider.inputs.tolist() == [[9, 9]]


async def test_hermes3_fixture(shared_fixtures: Path) -> None:
    root = shared_fixtures / "data" / "hermes3"
    provider = PreprocessedDataProvider(root / "data", 4096)
    batch = provider.get_batch(BatchId(0, 1))
    assert (await provider.get_samples(BatchId(0, 1))).tolist() == batch.inputs.tolist()
    for index in (0, 1):
        expected = json.loads((root / "decoded" / f"{index}.json").read_text())
        assert batch.inputs[index].tolist() == expected["inputs"]
        assert batch.labels is not None and batch.labels[index].tolist() == expected["labels"]
        assert batch.position_ids is not None
        assert batch.position_ids[index].tolist() == expected["position_ids"]
        assert batch.sequence_lengths is not None
        assert batch.sequence_lengths[index].tolist() == expected["sequence_lengths"]
