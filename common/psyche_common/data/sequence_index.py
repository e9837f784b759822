"""Which tokens each global sequence index reads: the sequence table and its seeded shuffle.

Pure logic, no file I/O. Sequences are ``seq_len`` tokens long, cut with stride ``seq_len`` and
no overlap from each source in order, and every full sequence of every source is used (the
reference drops the last one and crashes on sources shorter than one sequence). When a 32-byte
seed is given, the table is permuted by :func:`shuffled_order`, which every client computes
identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from psyche_common.config.data_location import DontShuffle, SeededShuffle
from psyche_common.data.errors import DataFileError, DataIndexError

SHUFFLE_SEED_BYTES = 32


def parse_shuffle(value: Any) -> bytes | None:
    """Turn a reference ``Shuffle`` value into a 32-byte seed, or None for ``DontShuffle``.

    Accepts ``None``, ``"DontShuffle"``, the config's shuffle variants, ``{"Seeded": [32 ints]}``, a list of 32 ints in 0–255,
    or 32 raw bytes.
    """
    if value is None or value == "DontShuffle" or isinstance(value, DontShuffle):
        return None
    if isinstance(value, SeededShuffle):
        return value.seed_bytes
    if isinstance(value, dict):
        if set(value) != {"Seeded"}:
            raise DataFileError(
                f"shuffle must be 'DontShuffle' or {{Seeded = [32 bytes]}}, got {value!r}"
            )
        value = value["Seeded"]
    if isinstance(value, bytes | bytearray) or (
        isinstance(value, list | tuple) and all(isinstance(v, int) and 0 <= v <= 255 for v in value)
    ):
        seed = bytes(value)
    else:
        raise DataFileError(
            f"shuffle seed must be {SHUFFLE_SEED_BYTES} integers in 0-255, got {value!r}"
        )
    if len(seed) != SHUFFLE_SEED_BYTES:
        raise DataFileError(
            f"shuffle seed must be exactly {SHUFFLE_SEED_BYTES} bytes, got {len(seed)}"
        )
    return seed


def shuffled_order(count: int, seed: bytes) -> np.ndarray:
    """A permutation of ``range(count)`` that depends only on ``seed`` and ``count``.

    The 32-byte seed, read as a little-endian integer, seeds NumPy's PCG64 bit generator; the
    permutation is the stable argsort of ``count`` raw 64-bit outputs. Using the raw PCG64
    stream (a fixed algorithm) rather than ``Generator.permutation`` keeps the order identical
    across NumPy versions, which every client must agree on.
    """
    if len(seed) != SHUFFLE_SEED_BYTES:
        raise DataFileError(
            f"shuffle seed must be exactly {SHUFFLE_SEED_BYTES} bytes, got {len(seed)}"
        )
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    bit_generator = np.random.PCG64(int.from_bytes(seed, "little"))
    keys = bit_generator.random_raw(count)
    return np.argsort(keys, kind="stable").astype(np.int64)


def sequence_table(token_counts: Sequence[int], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(source index, token offset) of every full ``seq_len`` sequence, in source order."""
    if seq_len <= 0:
        raise DataFileError(f"sequence length must be positive, got {seq_len}")
    per_source = np.array([count // seq_len for count in token_counts], dtype=np.int64)
    total = int(per_source.sum())
    sources = np.repeat(np.arange(len(per_source), dtype=np.int64), per_source)
    first_of_source = np.repeat(np.cumsum(per_source) - per_source, per_source)
    offsets = (np.arange(total, dtype=np.int64) - first_of_source) * seq_len
    return sources, offsets


class SequenceTable:
    """Where each global sequence index starts: (source index, token offset), maybe shuffled.

    ``description`` names the data in errors (a file, a directory, a URL).
    """

    def __init__(
        self,
        token_counts: Sequence[int],
        seq_len: int,
        shuffle_seed: bytes | None = None,
        description: str = "the data",
    ) -> None:
        self.seq_len = seq_len
        self.description = description
        self.shuffle_seed = shuffle_seed
        self._source_of, self._offset_of = sequence_table(token_counts, seq_len)
        if shuffle_seed is not None:
            order = shuffled_order(len(self._source_of), shuffle_seed)
            self._source_of, self._offset_of = self._source_of[order], self._offset_of[order]

    def __len__(self) -> int:
        return len(self._source_of)

    def check_range(self, start: int, end: int) -> None:
        """Raise ``DataIndexError`` unless ``0 <= start <= end < len(self)``."""
        if end < start:
            raise DataIndexError(f"empty sample range [{start}, {end}] for {self.description}")
        for index in (start, end):
            if not 0 <= index < len(self):
                raise DataIndexError(
                    f"index {index} is out of bounds: the data has {len(self)} sequences "
                    f"of {self.seq_len} tokens ({self.description})"
                )

    def locate(self, index: int) -> tuple[int, int]:
        """(source index, token offset) of sequence ``index``."""
        self.check_range(index, index)
        return int(self._source_of[index]), int(self._offset_of[index])

    def locate_range(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Source indices and token offsets of sequences ``start..end`` (inclusive)."""
        self.check_range(start, end)
        return self._source_of[start : end + 1], self._offset_of[start : end + 1]
