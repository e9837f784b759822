"""The preprocessed (parquet) provider used for fine-tuning data.

Rows have an ``inputs`` list of exactly ``seq_len`` token ids, and optionally ``labels`` and
``position_ids`` of the same length and ``sequence_lengths`` of any length (packed
sub-sequences). Files are chosen like the reference: the "parquet converter" layout (parent
directory named after the split, or ``<split>-…``; grandparent = subset when one is asked for),
else files whose name starts with the split; sorted by stem. All rows are loaded into memory,
optionally shuffled, and ``get_samples`` wraps indices modulo the row count (this provider
cycles epochs). A location that is not a local path is downloaded from the Hugging Face Hub.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from psyche_common.batch_id import BatchId
from psyche_common.data.errors import DataFileError
from psyche_common.data.sequence_index import parse_shuffle, shuffled_order

if TYPE_CHECKING:
    import pyarrow as pa

SPLIT_NAMES = ("train", "test", "validation", "dev", "val")
FIXED_LENGTH_COLUMNS = ("inputs", "labels", "position_ids")


@dataclass(frozen=True)
class PreprocessedBatch:
    """All columns of a batch of rows (absent optional columns are None)."""

    inputs: np.ndarray
    labels: np.ndarray | None
    position_ids: np.ndarray | None
    sequence_lengths: list[np.ndarray] | None


def _split_matches(name: str, split: str) -> bool:
    lowered = name.lower()
    return lowered == split or lowered.split("-", 1)[0] == split


def find_parquet_files(
    root: str | os.PathLike[str], split: str | None = "train", subset: str | None = None
) -> list[Path]:
    """The parquet files of ``split`` (all of them when None) under ``root``, sorted by stem."""
    base = Path(root).expanduser()
    if not base.is_dir():
        raise DataFileError(f"dataset directory {base} does not exist")
    files = [p for p in base.rglob("*.parquet") if p.is_file()]
    if not files:
        raise DataFileError(f"No files in dataset {base} (no *.parquet)")
    if split is not None:
        split = split.lower()
        chosen = [
            p
            for p in files
            if _split_matches(p.parent.name, split)
            and (subset is None or p.parent.parent.name == subset)
        ]
        if not chosen:
            chosen = [p for p in files if p.name.lower().startswith(split)]
        if not chosen:
            raise DataFileError(
                f"Could not determine split {split!r} in {base}: no parquet file in a "
                f"'{split}' directory or named '{split}…'"
            )
        files = chosen
    return sorted(files, key=lambda p: (p.stem, str(p)))


def _fixed_column(table: pa.Table, column: str, seq_len: int, source: Path) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    values = table.column(column).combine_chunks()
    value_type = values.type
    if not (pa.types.is_list(value_type) or pa.types.is_large_list(value_type)):
        raise DataFileError(f"{source}: column `{column}` is {value_type}, not a list of integers")
    item_type = value_type.value_type
    if not (pa.types.is_integer(item_type) or pa.types.is_boolean(item_type)):
        raise DataFileError(f"{source}: column `{column}` holds {item_type}, not integers")
    if values.null_count:
        raise DataFileError(f"{source}: column `{column}` has empty (null) rows")
    lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(lengths != seq_len)
    if len(wrong):
        row = int(wrong[0])
        raise DataFileError(
            f"{source}: `{column}` has length {int(lengths[row])} instead of {seq_len} (row {row})"
        )
    flat: np.ndarray = values.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    return flat.reshape(len(values), seq_len)


def _ragged_column(table: pa.Table, column: str, source: Path) -> list[np.ndarray]:
    import pyarrow as pa

    values = table.column(column).combine_chunks()
    if not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)):
        raise DataFileError(f"{source}: column `{column}` is {values.type}, not a list of integers")
    if not pa.types.is_integer(values.type.value_type):
        raise DataFileError(f"{source}: column `{column}` holds {values.type.value_type}")
    return [
        np.asarray(row if row is not None else [], dtype=np.int64) for row in values.to_pylist()
    ]


def load_parquet_rows(files: Sequence[Path], seq_len: int) -> dict[str, Any]:
    """Columns of every row of ``files``, concatenated in order."""
    import pyarrow.parquet as pq

    columns: dict[str, list[Any]] = {}
    present: set[str] | None = None
    for path in files:
        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as exc:
            raise DataFileError(f"cannot read parquet file {path}: {exc}") from None
        names = set(table.column_names) & {*FIXED_LENGTH_COLUMNS, "sequence_lengths"}
        if "inputs" not in names:
            raise DataFileError(f"Dataset does not have `inputs` column: {path}")
        if present is None:
            present = names
        elif names != present:
            raise DataFileError(
                f"{path} has columns {sorted(names)}, the first file {sorted(present)}"
            )
        for column in FIXED_LENGTH_COLUMNS:
            if column in names:
                columns.setdefault(column, []).append(_fixed_column(table, column, seq_len, path))
        if "sequence_lengths" in names:
            columns.setdefault("sequence_lengths", []).extend(
                _ragged_column(table, "sequence_lengths", path)
            )
    result: dict[str, Any] = {
        c: np.concatenate(columns[c]) for c in FIXED_LENGTH_COLUMNS if c in columns
    }
    if "sequence_lengths" in columns:
        result["sequence_lengths"] = columns["sequence_lengths"]
    if len(result["inputs"]) == 0:
        raise DataFileError(f"Empty dataset: no rows in {', '.join(map(str, files))}")
    return result


def download_dataset(repo_id: str) -> Path:
    """Download the parquet files of a Hugging Face dataset repo (uses ``HF_TOKEN`` if set)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, repo_type="dataset", allow_patterns=["*.parquet"]))
    except Exception as exc:
        raise DataFileError(
            f"{repo_id!r} is not a local directory and downloading it from the Hugging Face "
            f"Hub failed: {exc}"
        ) from None


class PreprocessedDataProvider:
    """Rows of parquet files; sample ``i`` is row ``i mod num_rows``."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        seq_len: int,
        shuffle: Any = None,
        split: str | None = "train",
        subset: str | None = None,
    ) -> None:
        self.files = find_parquet_files(directory, split, subset)
        self.seq_len = seq_len
        columns = load_parquet_rows(self.files, seq_len)
        order: np.ndarray | None = None
        seed = parse_shuffle(shuffle)
        if seed is not None:
            order = shuffled_order(len(columns["inputs"]), seed)
        self.inputs: np.ndarray = columns["inputs"]
        self.labels: np.ndarray | None = columns.get("labels")
        self.position_ids: np.ndarray | None = columns.get("position_ids")
        self.sequence_lengths: list[np.ndarray] | None = columns.get("sequence_lengths")
        if order is not None:
            self.inputs = self.inputs[order]
            self.labels = None if self.labels is None else self.labels[order]
            self.position_ids = None if self.position_ids is None else self.position_ids[order]
            if self.sequence_lengths is not None:
                self.sequence_lengths = [self.sequence_lengths[i] for i in order.tolist()]

    @classmethod
    async def from_location(
        cls, location: str, seq_len: int, shuffle: Any = None, split: str | None = "train"
    ) -> PreprocessedDataProvider:
        """A local directory (or a file inside one), else a Hub dataset repo id."""
        path = Path(location).expanduser()
        if not path.exists():
            path = await asyncio.to_thread(download_dataset, location)
        directory = path if path.is_dir() else path.parent
        return await asyncio.to_thread(cls, directory, seq_len, shuffle, split)

    @property
    def num_sequences(self) -> int:
        return len(self.inputs)

    def _rows(self, batch: BatchId) -> np.ndarray:
        return np.arange(batch.start, batch.end + 1, dtype=np.int64) % self.num_sequences

    async def get_samples(self, batch: BatchId) -> np.ndarray:
        return np.take(self.inputs, self._rows(batch), axis=0)

    async def aclose(self) -> None:
        """Nothing to release: the rows live in memory."""

    def get_batch(self, batch: BatchId) -> PreprocessedBatch:
        """Every column of the batch's rows."""
        rows = self._rows(batch)
        return PreprocessedBatch(
            inputs=self.inputs[rows],
            labels=None if self.labels is None else self.labels[rows],
            position_ids=None if self.position_ids is None else self.position_ids[rows],
            sequence_lengths=(
                None
                if self.sequence_lengths is None
                else [self.sequence_lengths[r] for r in rows.tolist()]
            ),
        )
