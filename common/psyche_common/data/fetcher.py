"""``SampleFetcher``: how a client gets the training samples of a batch (one place decides).

The fetcher builds the provider for the run's ``data_location`` on first use, once, under a
lock: the location and ``max_seq_len`` are read from its ``DataSource`` (or a callable giving
one) at that moment, because a client learns them from the first coordinator state it
receives. ``factory.make_provider`` builds it (``Server`` locations through
``data_server_provider_factory`` with the run's ``max_seq_len`` and the client's identity).
Every fetch goes through ``get_samples_with_retries`` with the fetcher's ``RetryPolicy``; once
the attempts are spent, or on a failure no retry can cure, it raises a ``DataError``. HTTP
providers retry each request themselves: unless ``http_options`` are given, they use the same
policy, and their final error is not retried again, so a batch gets the policy's attempts
whatever the location.
``aclose()`` closes the provider; a fetch after it fails with ``DataFetchError``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psyche_common.batch_id import BatchId
from psyche_common.data.errors import DataFetchError
from psyche_common.data.factory import ServerProviderFactory, make_provider
from psyche_common.data.http_client import HttpOptions
from psyche_common.data.retry import RetryPolicy, get_samples_with_retries

if TYPE_CHECKING:
    import numpy as np

    from psyche_common.data.provider import DataProvider
    from psyche_common.protocol import Identity

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataSource:
    """Where a run's samples come from: its ``data_location`` (config model or TOML form) and
    the length of every sample (the model's ``max_seq_len``)."""

    location: Any
    seq_len: int
    run_id: str | None = None
    """The run's id (the TCP data server's handshake names it)."""
    server_key: bytes | None = None
    """The server's identity key (`--server-key`): the TCP data server must prove it."""


class SampleFetcher:
    """``await fetcher(batch)`` -> int64 samples of shape ``(len(batch), seq_len)``.

    Raises ``DataFetchError`` when the network failed on every attempt (or answered in a way
    no retry can change), ``DataIndexError`` when the batch is beyond the data, and
    ``DataFileError`` when the data location or its files are unusable; all are ``DataError``.
    """

    def __init__(
        self,
        source: DataSource | Callable[[], DataSource],
        identity: Identity | None,
        policy: RetryPolicy | None = None,
        *,
        http_options: HttpOptions | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        server_provider: ServerProviderFactory | None = None,
    ) -> None:
        self._source = source
        self.identity = identity
        self.policy = policy or RetryPolicy()
        self.http_options = http_options or HttpOptions(retry=self.policy)
        self.cache_dir = cache_dir
        self.server_provider = server_provider
        self._lock = asyncio.Lock()
        self._provider: DataProvider | None = None
        self._closed = False

    async def __call__(self, batch: BatchId) -> np.ndarray:
        provider = await self.provider()
        return await get_samples_with_retries(provider, batch, self.policy)

    async def provider(self) -> DataProvider:
        """The provider, built on the first call (concurrent callers wait for that build; a
        failed build is not remembered, so the next call tries again)."""
        async with self._lock:
            if self._closed:
                raise DataFetchError("the sample fetcher is closed", retryable=False)
            if self._provider is None:
                source = self._source() if callable(self._source) else self._source
                self._provider = await make_provider(
                    source.location,
                    source.seq_len,
                    identity=self.identity,
                    run_id=source.run_id,
                    server_key=source.server_key,
                    server_provider=self.server_provider,
                    http_options=self.http_options,
                    cache_dir=self.cache_dir,
                )
                logger.info("data provider ready: %r", self._provider)
            return self._provider

    async def aclose(self) -> None:
        """Close the provider (if one was built); later fetches fail. Idempotent."""
        async with self._lock:
            self._closed = True
            provider, self._provider = self._provider, None
        if provider is not None:
            await provider.aclose()
