"""``make_provider``: the data provider for a config ``data_location``.

``make_provider`` builds one from a ``data_location`` (the config model, or its TOML form such
as ``"Dummy"`` or ``{"Local": "/data"}``). The TCP data server's client
(``server_client.data_server_provider_factory``) is the default for ``Server`` locations; a
caller may inject another through ``server_provider``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

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
from psyche_common.config.loading import load_data_config
from psyche_common.data.builtin import BuiltinDataProvider
from psyche_common.data.dummy import DummyDataProvider
from psyche_common.data.errors import DataFileError
from psyche_common.data.http import HttpDataProvider
from psyche_common.data.http_client import HttpOptions
from psyche_common.data.local import LocalDataProvider
from psyche_common.data.preprocessed import PreprocessedDataProvider
from psyche_common.data.provider import DataProvider
from psyche_common.data.server_client import data_server_provider_factory
from psyche_common.data.token_files import recorded_token_size
from psyche_common.data.weighted import load_weighted_http

ServerProviderFactory = Callable[[str, int, Any, str | None], Awaitable[DataProvider]]
"""Builds the TCP data-server client: ``(address "host:port", seq_len, identity, run_id) ->
provider``."""

_LOCATION_ADAPTER: pydantic.TypeAdapter[AnyDataLocation] = pydantic.TypeAdapter(DataLocation)


def parse_data_location(location: Any) -> AnyDataLocation:
    """The config model of a data location given as a model or in TOML form."""
    if isinstance(location, DATA_LOCATION_VARIANTS):
        return location
    try:
        return _LOCATION_ADAPTER.validate_python(location)
    except pydantic.ValidationError as exc:
        raise DataFileError(f"invalid data_location {location!r}: {exc}") from None


def _local_provider(path_text: str, seq_len: int) -> LocalDataProvider:
    path = Path(path_text).expanduser()
    if path.is_file() and path.suffix == ".toml":
        # a data.toml: the same files, token size and shuffle the TCP data server would use
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
    run_id: str | None = None,
    server_key: bytes | None = None,
    server_provider: ServerProviderFactory | None = None,
    http_options: HttpOptions | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> DataProvider:
    """A provider for ``location`` serving samples of ``seq_len`` tokens.

    ``identity`` and ``run_id`` are handed to ``server_provider`` (default:
    ``data_server_provider_factory``) for ``Server`` locations (the data server authenticates
    clients with their key, in a handshake that names the run; with ``server_key`` the default
    client talks only to a data server proving that key); ``cache_dir``
    overrides ``$PSYCHE_CACHE_DIR`` for builtin corpora.
    """
    if seq_len <= 0:
        raise DataFileError(f"sequence length must be positive, got {seq_len}")
    parsed = parse_data_location(location)
    if isinstance(parsed, DummyData):
        return DummyDataProvider(seq_len)
    if isinstance(parsed, ServerData):
        if server_provider is not None:
            return await server_provider(parsed.address, seq_len, identity, run_id)
        return await data_server_provider_factory(
            parsed.address, seq_len, identity, run_id, server_key=server_key
        )
    if isinstance(parsed, LocalData):
        return await asyncio.to_thread(_local_provider, parsed.path, seq_len)
    if isinstance(parsed, HttpData):
        return await HttpDataProvider.from_config(parsed, seq_len, http_options)
    if isinstance(parsed, WeightedHttpData):
        return await load_weighted_http(parsed.url, seq_len, http_options)
    if isinstance(parsed, PreprocessedData):
        return await PreprocessedDataProvider.from_location(parsed.url, seq_len)
    # the first use builds the corpus (about a second): keep the event loop free meanwhile
    return await asyncio.to_thread(BuiltinDataProvider, parsed.name, seq_len, cache_dir)
