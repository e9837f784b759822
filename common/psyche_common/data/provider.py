"""The provider interface every data source implements, and ``make_provider`` for config values.

A provider turns a ``BatchId`` (inclusive global sample indices) into an int64 array of shape
``(end - start + 1, seq_len)``. ``make_provider`` builds one from a ``data_location`` (the
config model, or its TOML form such as ``"Dummy"`` or ``{"Local": "/data"}``). The TCP data
server's client (``server_client.DataServerProvider``) is the default for ``Server``
locations; a caller may inject another through ``server_provider``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pydantic

from psyche_common.config.data_location import (
    DATA_LOCATION_VARIANTS,
    AnyDataLocation,
    DataLocation,
    DummyData,
    HttpData,
    LocalData,
    PreprocessedData,
    ServerData,
    WeightedHttpData,
)
from psyche_common.data.errors import DataFileError

if TYPE_CHECKING:
    from psyche_common.assignment import BatchId
    from psyche_common.data.http_client import HttpOptions


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


ServerProviderFactory = Callable[[str, int, Any], Awaitable[DataProvider]]
"""Builds the TCP data-server client: ``(address "host:port", seq_len, identity) -> provider``."""

TOKENIZE_METADATA = "metadata.json"
"""Written by ``psyche-data tokenize`` next to the token files; gives their token size."""

_LOCATION_ADAPTER: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(DataLocation)


def parse_data_location(location: Any) -> AnyDataLocation:
    """The config model of a data location given as a model or in TOML form."""
    if isinstance(location, DATA_LOCATION_VARIANTS):
        return location
    try:
        return _LOCATION_ADAPTER.validate_python(location)
    except pydantic.ValidationError as exc:
        raise DataFileError(f"invalid data_location {location!r}: {exc}") from None


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


def _local_provider(path_text: str, seq_len: int) -> DataProvider:
    from psyche_common.data.local import LocalDataProvider

    path = Path(path_text).expanduser()
    if path.is_file() and path.suffix == ".toml":
        # a data.toml: the same files, token size and shuffle the TCP data server would use
        from psyche_common.config.loading import load_data_config

        config = load_data_config(path)
        if int(config.seq_len) != seq_len:
            raise DataFileError(
                f"{path} has seq_len {config.seq_len} but the model's max_seq_len is {seq_len}"
            )
        return LocalDataProvider(config.dir, config.token_size, seq_len, config.shuffle_seed_bytes)
    return LocalDataProvider(path, recorded_token_size(path), seq_len)


async def make_provider(
    location: Any,
    seq_len: int,
    *,
    identity: Any = None,
    server_provider: ServerProviderFactory | None = None,
    http_options: HttpOptions | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> DataProvider:
    """A provider for ``location`` serving samples of ``seq_len`` tokens.

    ``identity`` is handed to ``server_provider`` (default: ``DataServerProvider``) for ``Server``
    locations (the data server authenticates clients with their key); ``cache_dir`` overrides ``$PSYCHE_CACHE_DIR`` for
    builtin corpora.
    """
    if seq_len <= 0:
        raise DataFileError(f"sequence length must be positive, got {seq_len}")
    parsed = parse_data_location(location)
    if isinstance(parsed, DummyData):
        from psyche_common.data.dummy import DummyDataProvider

        return DummyDataProvider(seq_len)
    if isinstance(parsed, ServerData):
        if server_provider is None:
            from psyche_common.data.server_client import data_server_provider_factory

            server_provider = data_server_provider_factory
        return await server_provider(parsed.address, seq_len, identity)
    if isinstance(parsed, LocalData):
        return await asyncio.to_thread(_local_provider, parsed.path, seq_len)
    if isinstance(parsed, HttpData):
        from psyche_common.data.http import HttpDataProvider

        return await HttpDataProvider.from_config(parsed, seq_len, http_options)
    if isinstance(parsed, WeightedHttpData):
        from psyche_common.data.weighted import load_weighted_http

        return await load_weighted_http(parsed.url, seq_len, http_options)
    if isinstance(parsed, PreprocessedData):
        from psyche_common.data.preprocessed import PreprocessedDataProvider

        return await PreprocessedDataProvider.from_location(parsed.url, seq_len)
    from psyche_common.data.builtin import BuiltinDataProvider

    # the first use builds the corpus (about a second): keep the event loop free meanwhile
    return await asyncio.to_thread(BuiltinDataProvider, parsed.name, seq_len, cache_dir)


provider_from_location = make_provider
