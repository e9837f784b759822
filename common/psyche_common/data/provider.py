"""The ``DataProvider`` protocol: what every data source implements (no implementation here).

A provider turns a ``BatchId`` (inclusive global sample indices) into an int64 array of shape
``(end - start + 1, seq_len)``, and ``aclose()`` releases whatever it holds open. The
implementations (``local``, ``http``, ``weighted``, ...) import this module;
``factory.make_provider`` imports them, so the dependency graph has no cycle and importing the
protocol loads no implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from psyche_common.batch_id import BatchId

if TYPE_CHECKING:
    import numpy as np


@runtime_checkable
class DataProvider(Protocol):
    """Anything that serves token sequences by global sample index."""

    seq_len: int

    @property
    def num_sequences(self) -> int | None:
        """How many samples exist (None when unknown or unbounded)."""
        ...

    async def get_samples(self, batch: BatchId) -> np.ndarray:
        """Samples ``batch.start..batch.end`` as int64, shape ``(len(batch), seq_len)``."""
        ...

    async def aclose(self) -> None:
        """Release connections and sessions (a no-op for providers that hold none)."""
        ...
