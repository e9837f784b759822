"""`BatchId`: an inclusive range of global sample indices (one sample = `max_seq_len` tokens).

A leaf module (it imports nothing from the coordinator), so the data readers, the client and
the coordinator's assignment can all name a batch without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class BatchId:
    """Inclusive range `[start, end]` of global sample indices."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"BatchId needs 0 <= start <= end, got [{self.start}, {self.end}]")

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __str__(self) -> str:
        if self.start == self.end:
            return f"B{self.start}"
        return f"B[{self.start}, {self.end}]"

    def __contains__(self, sample_index: object) -> bool:
        return isinstance(sample_index, int) and self.start <= sample_index <= self.end

    def to_wire(self) -> list[int]:
        return [self.start, self.end]

    @classmethod
    def from_wire(cls, data: Any) -> BatchId:
        if (
            not isinstance(data, list | tuple)
            or len(data) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in data)
        ):
            raise ValueError(f"batch id must be [start, end] integers, got {data!r}")
        return cls(data[0], data[1])
