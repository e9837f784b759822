"""The dummy provider: all-zero sequences of the model's ``max_seq_len`` (tests, smoke runs).

Unlike the reference (hard-coded 2048 tokens, and an off-by-one that accepts id ==
num_sequences), the length is the configured ``seq_len`` and ids must be < ``num_sequences``.
"""

from __future__ import annotations

import numpy as np

from psyche_common.batch_id import BatchId
from psyche_common.data.errors import DataIndexError


class DummyDataProvider:
    """Zeros. ``num_sequences=None`` means unbounded."""

    def __init__(self, seq_len: int, num_sequences: int | None = None) -> None:
        if seq_len <= 0:
            raise ValueError(f"sequence length must be positive, got {seq_len}")
        self.seq_len = seq_len
        self.num_sequences = num_sequences

    async def get_samples(self, batch: BatchId) -> np.ndarray:
        if self.num_sequences is not None and batch.end >= self.num_sequences:
            raise DataIndexError(
                f"index {batch.end} is out of bounds: the dummy data has "
                f"{self.num_sequences} sequences"
            )
        return np.zeros((batch.end - batch.start + 1, self.seq_len), dtype=np.int64)

    async def aclose(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return f"DummyDataProvider(seq_len={self.seq_len}, num_sequences={self.num_sequences})"
