"""Memory-mapped token files and the fixed-length sequences read from a list of them.

A token file is a flat little-endian array of u16 (``TwoBytes``) or u32 (``FourBytes``) token
ids: datatrove ``.ds``, raw ``.bin`` and Nanotron "nanoset" ``.npy`` files. Nanosets have no
NumPy header; a ``.npy`` that starts with the ``\\x93NUMPY`` magic is a real NumPy file, whose
header is parsed and skipped (its dtype must match the token size). ``psyche-data tokenize``
records the token size of the files it writes in ``metadata.json`` next to them
(``recorded_token_size`` reads it back).

`TokenSequences` cuts ``seq_len``-token sequences from such files through the sequence table
of :mod:`psyche_common.data.sequence_index` (whose names are re-exported here).
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from psyche_common.batch_id import BatchId
from psyche_common.config.enums import TokenSize
from psyche_common.data.errors import DataFileError
from psyche_common.data.sequence_index import (
    SHUFFLE_SEED_BYTES,
    SequenceTable,
    parse_shuffle,
    sequence_table,
    shuffled_order,
)

DATA_FILE_EXTENSIONS: tuple[str, ...] = (".npy", ".bin", ".ds")
NUMPY_MAGIC = b"\x93NUMPY"
TOKENIZE_METADATA = "metadata.json"
"""Written by ``psyche-data tokenize`` next to the token files; gives their token size."""
_ALLOW_FAIL_MMAP_VALUES = {"1", "true", "yes"}

__all__ = [
    "DATA_FILE_EXTENSIONS",
    "NUMPY_MAGIC",
    "SHUFFLE_SEED_BYTES",
    "TOKENIZE_METADATA",
    "SequenceTable",
    "TokenSequences",
    "TokenSequencesProvider",
    "list_token_files",
    "open_token_file",
    "parse_shuffle",
    "parse_token_size",
    "recorded_token_size",
    "sequence_table",
    "shuffled_order",
    "token_dtype",
]


def parse_token_size(value: TokenSize | str | int) -> TokenSize:
    """Accept a ``TokenSize``, ``"TwoBytes"``/``"FourBytes"``, or 2/4 (also as strings)."""
    if isinstance(value, TokenSize):
        return value
    if isinstance(value, str):
        for member in TokenSize:
            if value.strip().lower() == member.value.lower():
                return member
    try:
        return TokenSize.from_num_bytes(int(value))
    except (TypeError, ValueError):
        raise DataFileError(
            f"Unsupported token bytes length {value!r}: expected 2, 4, 'TwoBytes' or 'FourBytes'"
        ) from None


def token_dtype(token_size: TokenSize) -> np.dtype[Any]:
    """Little-endian u16 or u32."""
    return np.dtype("<u2") if token_size is TokenSize.TWO_BYTES else np.dtype("<u4")


def recorded_token_size(directory: Path) -> str:
    """Token size recorded by ``psyche-data tokenize`` in the directory, else TwoBytes.

    Raises ``DataFileError`` naming the file when its ``metadata.json`` cannot be read."""
    metadata = directory / TOKENIZE_METADATA
    if metadata.is_file():
        try:
            return str(json.loads(metadata.read_text())["token_size"])
        except (ValueError, KeyError, OSError) as exc:
            raise DataFileError(f"unreadable {metadata}: {exc}") from None
    return "TwoBytes"


def list_token_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Top-level token files of ``directory`` sorted by name (subdirectories are ignored)."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise DataFileError(f"training data directory {path} does not exist or is not a directory")
    files = sorted(
        (p for p in path.resolve().iterdir() if p.is_file() and p.suffix in DATA_FILE_EXTENSIONS),
        key=lambda p: p.name,
    )
    if not files:
        raise DataFileError(
            f"No training data files in directory {path} (looked for {', '.join(DATA_FILE_EXTENSIONS)})"
        )
    return files


def _numpy_header(path: Path, token_size: TokenSize) -> tuple[int, int]:
    """Parse a NumPy header: returns (payload byte offset, number of tokens it declares)."""
    with path.open("rb") as f:
        prefix = f.read(len(NUMPY_MAGIC) + 2)
        major = prefix[len(NUMPY_MAGIC)]
        if major == 1:
            (header_len,) = struct.unpack("<H", f.read(2))
            offset = len(prefix) + 2 + header_len
        elif major in (2, 3):
            (header_len,) = struct.unpack("<I", f.read(4))
            offset = len(prefix) + 4 + header_len
        else:
            raise DataFileError(f"{path}: unsupported NumPy file format version {major}")
        raw_header = f.read(header_len)
    try:
        header = ast.literal_eval(raw_header.decode("utf-8" if major == 3 else "latin1"))
        descr, fortran_order, shape = (
            header["descr"],
            header["fortran_order"],
            tuple(header["shape"]),
        )
        dtype = np.dtype(descr)
    except (ValueError, SyntaxError, KeyError, TypeError) as exc:
        raise DataFileError(f"{path}: unreadable NumPy header ({exc})") from None
    if dtype.kind not in "iu" or dtype.itemsize != token_size.num_bytes:
        raise DataFileError(
            f"{path}: NumPy dtype {dtype} does not match the token size of {token_size.num_bytes} "
            "bytes (wrong token size?)"
        )
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False):
        raise DataFileError(f"{path}: big-endian NumPy data is not supported")
    if fortran_order and len(shape) > 1:
        raise DataFileError(f"{path}: Fortran-ordered NumPy arrays are not supported")
    return offset, int(np.prod(shape, dtype=np.int64))


def open_token_file(path: str | os.PathLike[str], token_size: TokenSize) -> np.ndarray:
    """Memory-map a token file read-only as a 1-D little-endian u16/u32 array.

    If mmap fails and ``ALLOW_FAIL_MMAP`` is 1/true/yes, the file is read into memory instead.
    """
    file_path = Path(path)
    try:
        size = file_path.stat().st_size
        with file_path.open("rb") as f:
            magic = f.read(len(NUMPY_MAGIC))
    except OSError as exc:
        raise DataFileError(f"cannot open token file {file_path}: {exc}") from None
    offset, declared = 0, None
    if file_path.suffix == ".npy" and magic == NUMPY_MAGIC:
        offset, declared = _numpy_header(file_path, token_size)
    payload = size - offset
    if declared is not None:
        if declared * token_size.num_bytes > payload:
            raise DataFileError(
                f"{file_path}: NumPy header declares {declared} tokens but the file holds only "
                f"{payload // token_size.num_bytes}"
            )
        count = declared
    else:
        if payload % token_size.num_bytes:
            raise DataFileError(
                f"{file_path} is {payload} bytes, not a whole number of {token_size.num_bytes}-byte "
                "tokens (wrong token size?)"
            )
        count = payload // token_size.num_bytes
    if count == 0:
        return np.zeros(0, dtype=token_dtype(token_size))
    try:
        return np.memmap(
            file_path, dtype=token_dtype(token_size), mode="r", offset=offset, shape=(count,)
        )
    except (OSError, ValueError) as exc:
        if os.environ.get("ALLOW_FAIL_MMAP", "").lower() not in _ALLOW_FAIL_MMAP_VALUES:
            raise DataFileError(f"cannot memory-map token file {file_path}: {exc}") from None
        return np.fromfile(file_path, dtype=token_dtype(token_size), count=count, offset=offset)


class TokenSequences:
    """Fixed-length sequences over a list of 1-D token arrays, optionally globally shuffled."""

    def __init__(
        self,
        sources: Sequence[np.ndarray],
        names: Sequence[str],
        seq_len: int,
        shuffle_seed: bytes | None = None,
        description: str | None = None,
    ) -> None:
        if len(sources) != len(names):
            raise ValueError("every token source needs a name")
        self.seq_len = seq_len
        self.names = list(names)
        self._sources = list(sources)
        if description is None:
            description = self.names[0] if len(self.names) == 1 else f"{len(self.names)} files"
        self.table = SequenceTable([len(s) for s in sources], seq_len, shuffle_seed, description)
        self.shuffle_seed = shuffle_seed

    @classmethod
    def from_files(
        cls,
        paths: Sequence[str | os.PathLike[str]],
        token_size: TokenSize,
        seq_len: int,
        shuffle_seed: bytes | None = None,
        description: str | None = None,
    ) -> TokenSequences:
        arrays = [open_token_file(p, token_size) for p in paths]
        return cls(arrays, [str(p) for p in paths], seq_len, shuffle_seed, description)

    @property
    def num_sequences(self) -> int:
        return len(self.table)

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self._sources)

    def locate(self, index: int) -> tuple[str, int]:
        """(source name, token offset) where sequence ``index`` starts."""
        source, offset = self.table.locate(index)
        return self.names[source], offset

    def sequence(self, index: int) -> np.ndarray:
        """Sequence ``index`` as int64 tokens."""
        row: np.ndarray = self.read(index, index)[0]
        return row

    def read(self, start: int, end: int) -> np.ndarray:
        """Sequences ``start..end`` (inclusive) as an int64 array of shape (n, seq_len)."""
        sources, offsets = self.table.locate_range(start, end)
        out = np.empty((end - start + 1, self.seq_len), dtype=np.int64)
        for row, (source, offset) in enumerate(
            zip(sources.tolist(), offsets.tolist(), strict=True)
        ):
            out[row] = self._sources[source][offset : offset + self.seq_len]
        return out

    def __iter__(self) -> Iterator[np.ndarray]:
        for index in range(self.num_sequences):
            yield self.sequence(index)

    def __len__(self) -> int:
        return self.num_sequences


class TokenSequencesProvider:
    """The provider methods shared by every provider that serves a ``sequences`` attribute
    (local token files, builtin corpora): reads are memory-mapped, run in a worker thread."""

    sequences: TokenSequences

    @property
    def num_sequences(self) -> int:
        return self.sequences.num_sequences

    def read(self, batch: BatchId) -> np.ndarray:
        """Synchronous ``get_samples``: sequences ``batch.start..batch.end`` (inclusive)."""
        return self.sequences.read(batch.start, batch.end)

    async def get_samples(self, batch: BatchId) -> np.ndarray:
        return await asyncio.to_thread(self.read, batch)

    async def aclose(self) -> None:
        """Nothing to release: the memory maps close with their arrays."""
