"""TCP data server: serves token sequences to authenticated clients of the current epoch.

Same framing, handshake and encrypted link as the coordinator port (signed with the server's
identity), in its own domain, which names the run (`data_server_domain(run_id)`). A request (`RequestTrainingData`) from a key
that is not in the latest broadcast's `epoch_state.clients` is rejected with `NotInThisRound`;
a provider failure becomes a `RequestRejected` reply (`OutOfRange` / `DataError`), never a crash.
Samples served per client are counted for the dashboard.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Protocol

import numpy as np
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import Coordinator
from psyche_common.data.errors import DataError, DataIndexError
from psyche_common.protocol import Identity, data_server_domain, short_id
from psyche_common.protocol.data_messages import (
    RejectReason,
    RequestRejected,
    RequestTrainingData,
    TrainingData,
    parse_data_request,
)
from psyche_common.protocol.messages import Rejected, to_wire

from .connections import Connection, ConnectionLimits, ConnectionManager

log = logging.getLogger("psyche.server.data")

FIRST_REQUEST_TIMEOUT = 10.0
"""Seconds an authenticated connection may wait before its first request."""
IDLE_TIMEOUT = 120.0
"""Seconds a connection may stay silent between two requests."""


class SampleProvider(Protocol):
    """What the data server serves from: a data provider with a known number of sequences."""

    @property
    def num_sequences(self) -> int: ...

    async def get_samples(self, batch: BatchId) -> np.ndarray: ...


def parse_socket_address(text: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) → (host, port); raises ValueError naming the text."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"data server address {text!r} is not host:port")
    return host.strip("[]"), int(port_text)


class DataServer:
    """Serves `provider` on `host:port` to the members of the latest broadcast state."""

    def __init__(
        self,
        provider: SampleProvider,
        host: str,
        port: int,
        limits: ConnectionLimits | None = None,
        *,
        run_id: str,
        identity: Identity | None = None,
        first_request_timeout: float = FIRST_REQUEST_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        self.provider = provider
        self.run_id = run_id
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self.allowed: frozenset[bytes] = frozenset()
        self.height = 0
        self.served: Counter[bytes] = Counter()
        self.rejections = 0
        self.first_request_timeout = first_request_timeout
        self._requested: set[Connection] = set()
        """Connections that sent a request (the others are closed at the first-request
        timeout)."""
        self.connections = ConnectionManager(
            "data-server",
            parse_data_request,
            self._on_request,
            limits or ConnectionLimits(),
            identity=identity or Identity.generate(),
            domain=data_server_domain(run_id),
            service=f"the data server of run {run_id!r}",
            on_connect=self._on_connect,
            on_disconnect=self._requested.discard,
            idle_timeout=idle_timeout,
        )

    @property
    def total_samples(self) -> int:
        return int(getattr(self.provider, "num_sequences", 0) or 0)

    @property
    def provided_samples(self) -> int:
        return sum(self.served.values())

    async def start(self) -> int:
        self.port = await self.connections.start(self.host, self.requested_port)
        log.info(
            "data server listening on %s:%d (%d samples)",
            self.host,
            self.port,
            self.total_samples,
            extra={"port": self.port},
        )
        return self.port

    async def close(self) -> None:
        await self.connections.close()

    def update_state(self, coordinator: Coordinator) -> None:
        """Take the epoch's members from the state that was just broadcast."""
        self.allowed = frozenset(client.id for client in coordinator.epoch_state.clients)
        rounds = coordinator.epoch_state.rounds
        self.height = rounds[coordinator.epoch_state.rounds_head].height
        for client_id, conn in list(self.connections.connections.items()):
            if client_id not in self.allowed:
                self._refuse(conn, "no longer a member of the current epoch")

    def _on_connect(self, conn: Connection) -> None:
        """Admission at the handshake: only epoch members keep a connection, and only if they
        ask for data soon."""
        if conn.peer_id not in self.allowed:
            self._refuse(conn, "not a member of the current epoch")
            return
        timeout = self.first_request_timeout
        asyncio.get_running_loop().call_later(timeout, self._close_if_silent, conn, timeout)

    def _close_if_silent(self, conn: Connection, timeout: float) -> None:
        if not conn.closed and conn not in self._requested:
            self._refuse(conn, f"no request within {timeout:g}s of the handshake")

    def _refuse(self, conn: Connection, why: str) -> None:
        reason = f"NotInThisRound: key {short_id(conn.peer_id)}: {why}"
        self.rejections += 1
        log.warning(
            "data server: closing %s: %s",
            conn,
            reason,
            extra={"client": short_id(conn.peer_id), "reason": reason},
        )
        conn.send(to_wire(Rejected(reason=reason)))
        conn.close(reason)

    async def _on_request(self, conn: Connection, request: RequestTrainingData) -> None:
        batch = BatchId(request.start, request.end)
        self._requested.add(conn)
        if conn.peer_id not in self.allowed:
            self._reject(conn, request, "NotInThisRound", "not a client of the current epoch")
            return
        try:
            samples = await self.provider.get_samples(batch)
            tokens = np.ascontiguousarray(samples, dtype="<i4")
            if tokens.ndim != 2 or tokens.shape[0] != len(batch):
                raise DataError(f"provider returned shape {samples.shape} for {batch}")
        except DataIndexError as exc:
            self._reject(conn, request, "OutOfRange", str(exc))
            return
        except Exception as exc:  # the provider's failure is the requester's error reply
            log.exception("data provider failed for %s", batch)
            self._reject(conn, request, "DataError", f"{type(exc).__name__}: {exc}")
            return
        reply = TrainingData(
            start=request.start, end=request.end, seq_len=tokens.shape[1], tokens=tokens.tobytes()
        )
        frame_limit = self.connections.limits.max_frame_size
        payload = to_wire(reply)
        if len(payload["tokens"]) + 256 > frame_limit:
            self._reject(
                conn, request, "TooLarge", f"reply would exceed the {frame_limit}-byte frame limit"
            )
            return
        conn.send(payload)
        self.served[conn.peer_id] += len(batch)

    def _reject(
        self, conn: Connection, request: RequestTrainingData, reason: RejectReason, detail: str
    ) -> None:
        self.rejections += 1
        log.warning(
            "data request %s..%s from %s rejected: %s (%s)",
            request.start,
            request.end,
            short_id(conn.peer_id),
            reason,
            detail,
            extra={"client": short_id(conn.peer_id), "reason": reason},
        )
        conn.send(
            to_wire(
                RequestRejected(start=request.start, end=request.end, reason=reason, detail=detail)
            )
        )
