"""`DataServerProvider`: fetches token sequences from the TCP data server (`data_location =
{ Server = "host:port" }`), authenticating with the client's ed25519 identity, over the
encrypted link the handshake opens (and, with `server_key`, only from a server proving it).

One connection, one request in flight (a lock), reconnecting on demand. A `NotInThisRound`
rejection, a refused connection (the server's `Rejected`, e.g. while an earlier connection of
the same identity is still open there) and network failures are retryable `DataFetchError`s; `OutOfRange` raises `DataIndexError`; `DataError` / `TooLarge` are permanent.
By default each call makes one attempt (callers wrap it in `get_samples_with_retries`, as the
reference's data fetcher does); pass a `RetryPolicy` to retry inside the provider. Replies
must have the run's `seq_len`. `data_server_provider_factory` is what
`factory.make_provider` uses for `Server` locations.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import numpy as np

from psyche_common.batch_id import BatchId
from psyche_common.data.errors import DataFetchError, DataIndexError
from psyche_common.data.retry import RetryPolicy, retry_async
from psyche_common.protocol import (
    ConnectionClosed,
    Identity,
    ProtocolError,
    SecureChannel,
    ServerKeyMismatch,
    connect_handshake,
    data_server_domain,
)
from psyche_common.protocol.data_messages import (
    RequestRejected,
    RequestTrainingData,
    parse_data_reply,
)
from psyche_common.protocol.messages import to_wire

logger = logging.getLogger(__name__)

DEFAULT_REPLY_FRAME_SIZE = 64 * 1024 * 1024


def connection_refusal(frame: object) -> str | None:
    """The reason of the server's connection-level ``Rejected`` (it answers that instead of
    serving a connection, then closes it), else None."""
    if isinstance(frame, dict) and frame.get("type") == "Rejected":
        return str(frame.get("reason") or "no reason given")
    return None


class DataServerProvider:
    """A data provider backed by the coordinator's TCP data server."""

    def __init__(
        self,
        address: str,
        identity: Identity,
        seq_len: int,
        *,
        run_id: str,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        max_frame_size: int = DEFAULT_REPLY_FRAME_SIZE,
        server_key: bytes | None = None,
    ) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"data server address {address!r} is not host:port")
        self.address = address
        self.host = host.strip("[]")
        self.port = int(port)
        self.identity = identity
        self.run_id = run_id
        """The run whose data server this is: the handshake signs for it alone."""
        self.timeout = timeout
        self.seq_len = seq_len
        self.retry = retry or RetryPolicy(attempts=1)
        self.max_frame_size = max_frame_size
        self.server_key = server_key
        """The server's identity key the data server must prove (None: any key)."""
        self._lock = asyncio.Lock()
        self._channel: SecureChannel | None = None

    @property
    def num_sequences(self) -> int | None:
        return None  # only the server knows

    async def get_samples(self, batch: BatchId) -> np.ndarray:
        """`(len(batch), seq_len)` int64 tokens of samples `batch.start..=batch.end`."""
        if self.retry.attempts == 1:
            return await self._request(batch)  # errors keep their `retryable` flag
        return await retry_async(
            lambda: self._request(batch), self.retry, f"data server {self.address} {batch}"
        )

    async def aclose(self) -> None:
        """Drop the connection (after any request in flight)."""
        async with self._lock:
            self._drop_connection()

    async def _connect(self) -> SecureChannel:
        if self._channel is None:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(self.host, self.port)
            try:
                self._channel = await connect_handshake(
                    reader,
                    writer,
                    self.identity,
                    domain=data_server_domain(self.run_id),
                    timeout=self.timeout,
                    server_key=self.server_key,
                )
            except BaseException:
                writer.transport.abort()
                raise
        return self._channel

    def _drop_connection(self) -> None:
        if self._channel is not None:
            with contextlib.suppress(Exception):
                self._channel.abort()
            self._channel = None

    async def _request(self, batch: BatchId) -> np.ndarray:
        async with self._lock:
            try:
                channel = await self._connect()
                await channel.send(to_wire(RequestTrainingData(start=batch.start, end=batch.end)))
                frame = await channel.read(self.max_frame_size, timeout=self.timeout)
                refusal = connection_refusal(frame)
                if refusal is not None:
                    self._drop_connection()
                    raise DataFetchError(
                        f"data server {self.address} refused the connection: {refusal}"
                    )
                reply = parse_data_reply(frame)
            except (ProtocolError, OSError, TimeoutError) as exc:
                self._drop_connection()
                if isinstance(exc, ServerKeyMismatch):
                    raise DataFetchError(
                        f"data server {self.address}: {exc}", retryable=False
                    ) from exc
                if isinstance(exc, ConnectionClosed | OSError | TimeoutError):
                    raise DataFetchError(f"data server {self.address}: {exc}") from exc
                raise DataFetchError(
                    f"data server {self.address} sent an invalid reply: {exc}", retryable=False
                ) from exc
        if (reply.start, reply.end) != (batch.start, batch.end):
            raise DataFetchError(
                f"data server {self.address} answered [{reply.start}, {reply.end}] "
                f"for request {batch}",
                retryable=False,
            )
        if isinstance(reply, RequestRejected):
            message = (
                f"data server {self.address} rejected {batch}: {reply.reason} ({reply.detail})"
            )
            if reply.reason == "NotInThisRound":
                raise DataFetchError(message, retryable=True)
            if reply.reason == "OutOfRange":
                raise DataIndexError(message)
            raise DataFetchError(message, retryable=False)
        if reply.seq_len != self.seq_len:
            raise DataFetchError(
                f"data server {self.address} serves sequences of {reply.seq_len} tokens, "
                f"but this run's max_seq_len is {self.seq_len}",
                retryable=False,
            )
        tokens = np.frombuffer(reply.tokens, dtype="<i4").reshape(len(batch), reply.seq_len)
        return tokens.astype(np.int64)

    def __repr__(self) -> str:
        return f"DataServerProvider({self.address!r})"


async def data_server_provider_factory(
    address: str,
    seq_len: int,
    identity: Identity,
    run_id: str | None,
    *,
    server_key: bytes | None = None,
) -> DataServerProvider:
    """The client for `data_location = { Server = address }` of run `run_id` serving
    `seq_len`-token samples (the default `ServerProviderFactory` of `factory.make_provider`)."""
    if identity is None:
        raise ValueError("the TCP data server needs the client's identity to authenticate")
    if run_id is None:
        raise ValueError("the TCP data server needs the run id (its handshake names the run)")
    return DataServerProvider(address, identity, seq_len, run_id=run_id, server_key=server_key)
