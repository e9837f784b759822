"""The trainer's DisTrO statistics of `--optim-stats-steps N` (computed by `distro.stats`).

`OptimStatsRecorder(every)` says which steps are measured (`due(step)`: every `every`-th step;
never with 0, the default, so the round pays nothing for them) and keeps what was measured,
per step, until the client takes it (`take()`, from another thread: the trainer records in its
worker thread). `results_index_overlap(layout, results)` is the `{name}.index_overlap` of the
results one step applies.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from psyche_client.distro.result import DistroResult, ResultLayout
from psyche_client.distro.stats import index_overlap

KEEP_STEPS = 64
"""Measured steps kept while nobody takes them (older ones are dropped)."""


class OptimStatsRecorder:
    def __init__(self, every: int = 0) -> None:
        if every < 0:
            raise ValueError(f"optim stats interval must be >= 0, got {every}")
        self.every = every
        self._lock = threading.Lock()
        self._pending: OrderedDict[int, dict[str, float]] = OrderedDict()

    def due(self, step: int) -> bool:
        """Whether `step` is measured."""
        return self.every > 0 and step % self.every == 0

    def record(self, step: int, values: Mapping[str, float]) -> None:
        """Add `values` to `step`'s statistics (a later value of a name replaces it)."""
        if not values:
            return
        with self._lock:
            self._pending.setdefault(step, {}).update(values)
            self._pending.move_to_end(step)
            while len(self._pending) > KEEP_STEPS:
                self._pending.popitem(last=False)

    def take(self) -> list[tuple[int, dict[str, float]]]:
        """Every step's statistics recorded since the last call, oldest first."""
        with self._lock:
            taken = list(self._pending.items())
            self._pending.clear()
        return taken


def results_index_overlap(
    layout: ResultLayout, results: Sequence[DistroResult]
) -> dict[str, float]:
    """Per parameter, `{name}.index_overlap` of `results`' chosen indices (none with fewer
    than two results)."""
    overlaps: dict[str, float] = {}
    if len(results) < 2:
        return overlaps
    for i, tensor in enumerate(layout.tensors):
        value = index_overlap([r.tensors[i].indices() for r in results], tensor.totalk)
        if value is not None:
            overlaps[f"{tensor.name}.index_overlap"] = value
    return overlaps
