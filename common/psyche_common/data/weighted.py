"""Weighted mixtures of providers, and their JSON config of weighted HTTP sources.

The mixture has N = Σ sizes slots. Provider i (normalised weight w_i) is due for its k-th
draw (k = 0, 1, …) at "time" k / w_i; the slots are all draws ordered by due time, ties to the
lower provider index, and the first N are kept. A draw k maps to local sample k mod size_i, so a
small, heavily weighted source repeats only after it has been fully used. This is a
deterministic, vectorised form of the reference's greedy "largest deficit first" interleave.
With a seed the slots are then permuted by ``shuffled_order``. An index ≥ N is an error (the
reference silently serves provider 0 / sample 0).

JSON config (``data_location = { WeightedHttp = "<url or path>" }``)::

    {"shuffle": "DontShuffle" | {"Seeded": [32 ints]},
     "providers": [[<Http location>, weight], ...]   # explicit weights, or
                | [<Http location>, ...]}            # weighted by each source's size

where an Http location is ``{"location": {...}, "token_size_in_bytes": ..., "shuffle": ...}``.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pydantic

from psyche_common.batch_id import BatchId
from psyche_common.config.data_location import HttpData
from psyche_common.data.errors import DataFileError, DataIndexError
from psyche_common.data.http import HttpDataProvider, first_error, resolve_location
from psyche_common.data.http_client import HttpOptions, HttpSession
from psyche_common.data.provider import DataProvider
from psyche_common.data.sequence_index import parse_shuffle, shuffled_order


def mixture_index(
    sizes: Sequence[int], weights: Sequence[float] | None = None, shuffle_seed: bytes | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(provider index, local sample index) of every slot of the mixture."""
    raw = [float(s) for s in sizes] if weights is None else [float(w) for w in weights]
    if len(raw) != len(sizes):
        raise DataFileError(f"{len(sizes)} providers but {len(raw)} weights")
    if any(not math.isfinite(w) or w < 0 for w in raw):
        raise DataFileError(f"mixture weights must be finite and >= 0, got {list(raw)}")
    active = [i for i, (size, w) in enumerate(zip(sizes, raw, strict=True)) if size > 0 and w > 0]
    total = sum(sizes)
    if not active:
        raise DataFileError("a mixture needs at least one non-empty provider with weight > 0")
    weight_sum = sum(raw[i] for i in active)
    providers, draws, due = [], [], []
    for i in active:
        share = raw[i] / weight_sum
        count = math.ceil(share * total) + 2  # the first N slots never need more draws
        k = np.arange(count, dtype=np.int64)
        providers.append(np.full(count, i, dtype=np.int64))
        draws.append(k)
        due.append(k / share)
    provider_of = np.concatenate(providers)
    draw_of = np.concatenate(draws)
    order = np.lexsort((provider_of, np.concatenate(due)))[:total]
    provider_of, draw_of = provider_of[order], draw_of[order]
    local_of = draw_of % np.asarray(sizes, dtype=np.int64)[provider_of]
    if shuffle_seed is not None:
        permutation = shuffled_order(total, shuffle_seed)
        provider_of, local_of = provider_of[permutation], local_of[permutation]
    return provider_of, local_of


def _runs(locals_sorted: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Split (local index, row) pairs sorted by local index into consecutive-index runs."""
    runs: list[list[tuple[int, int]]] = []
    for local, row in locals_sorted:
        if runs and runs[-1][-1][0] + 1 == local:
            runs[-1].append((local, row))
        else:
            runs.append([(local, row)])
    return runs


class WeightedDataProvider:
    """Interleaves samples of several providers of known size by weight."""

    def __init__(
        self,
        providers: Sequence[DataProvider],
        weights: Sequence[float] | None = None,
        shuffle: Any = None,
    ) -> None:
        sizes = [p.num_sequences for p in providers]
        if any(size is None for size in sizes):
            raise DataFileError("every provider of a mixture must know its number of sequences")
        seq_lens = {p.seq_len for p in providers}
        if len(seq_lens) != 1:
            raise DataFileError(f"mixed providers disagree on sequence length: {sorted(seq_lens)}")
        self.providers = list(providers)
        self.seq_len = seq_lens.pop()
        self._provider_of, self._local_of = mixture_index(
            [int(s) for s in sizes if s is not None], weights, parse_shuffle(shuffle)
        )

    @property
    def num_sequences(self) -> int:
        return len(self._provider_of)

    def source_of(self, index: int) -> tuple[int, int]:
        """(provider index, local sample index) of mixture slot ``index``."""
        if not 0 <= index < self.num_sequences:
            raise DataIndexError(
                f"index {index} is out of bounds: the mixture has {self.num_sequences} sequences"
            )
        return int(self._provider_of[index]), int(self._local_of[index])

    async def get_samples(self, batch: BatchId) -> np.ndarray:
        self.source_of(batch.start)
        self.source_of(batch.end)
        wanted: dict[int, list[tuple[int, int]]] = {}
        for row, index in enumerate(range(batch.start, batch.end + 1)):
            provider, local = self.source_of(index)
            wanted.setdefault(provider, []).append((local, row))
        out = np.empty((len(batch), self.seq_len), dtype=np.int64)

        async def fetch(provider: int, run: list[tuple[int, int]]) -> None:
            samples = await self.providers[provider].get_samples(BatchId(run[0][0], run[-1][0]))
            for (_, row), sample in zip(run, samples, strict=True):
                out[row] = sample

        try:
            async with asyncio.TaskGroup() as group:
                for provider, pairs in wanted.items():
                    for run in _runs(sorted(pairs)):
                        group.create_task(fetch(provider, run))
        except BaseExceptionGroup as errors:
            raise first_error(errors) from None
        return out

    async def aclose(self) -> None:
        """Close every mixed provider."""
        for provider in self.providers:
            await provider.aclose()


def parse_weighted_config(document: Any) -> tuple[list[HttpData], list[float] | None, Any]:
    """Validate a mixture config: (sources, weights or None for size-weighted, shuffle)."""
    if not isinstance(document, dict) or set(document) != {"shuffle", "providers"}:
        raise DataFileError(
            "a weighted HTTP config must be a JSON object with exactly 'shuffle' and 'providers'"
        )
    shuffle = parse_shuffle(document["shuffle"])
    entries = document["providers"]
    if not isinstance(entries, list) or not entries:
        raise DataFileError("'providers' must be a non-empty list")
    explicit = all(isinstance(e, list) and len(e) == 2 for e in entries)
    if not explicit and not all(isinstance(e, dict) for e in entries):
        raise DataFileError(
            "'providers' must be all [location, weight] pairs or all locations (not a mix)"
        )
    sources, weights = [], []
    for position, entry in enumerate(entries):
        location, weight = entry if explicit else (entry, None)
        try:
            sources.append(HttpData.model_validate(location))
        except pydantic.ValidationError as exc:
            raise DataFileError(
                f"providers[{position}] is not a valid HTTP location: {exc}"
            ) from None
        if explicit:
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                raise DataFileError(
                    f"providers[{position}] weight must be a number, got {weight!r}"
                )
            weights.append(float(weight))
    return sources, (weights if explicit else None), shuffle


async def load_weighted_http(
    config_location: str, seq_len: int, options: HttpOptions | None = None
) -> WeightedDataProvider:
    """Build the mixture described by the JSON at ``config_location`` (a URL or a local path)."""
    session = HttpSession(options)
    try:
        if config_location.startswith(("http://", "https://")):
            raw = await session.get_document(config_location)
        else:
            try:
                raw = Path(config_location).expanduser().read_bytes()
            except OSError as exc:
                raise DataFileError(
                    f"cannot read mixture config {config_location}: {exc}"
                ) from None
        try:
            document = json.loads(raw)
        except ValueError as exc:
            raise DataFileError(f"mixture config {config_location} is not JSON: {exc}") from None
        try:
            sources, weights, shuffle = parse_weighted_config(document)
        except DataFileError as exc:
            raise DataFileError(f"mixture config {config_location}: {exc}") from None
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(resolve_location(s.location, session)) for s in sources]
        except BaseExceptionGroup as errors:
            raise first_error(errors) from None
        providers = [
            HttpDataProvider(task.result(), s.token_size_in_bytes, seq_len, s.shuffle, session)
            for s, task in zip(sources, tasks, strict=True)
        ]
        return WeightedDataProvider(providers, weights, shuffle)
    except BaseException:
        await session.aclose()
        raise
