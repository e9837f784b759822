"""Authenticated client connections of a TCP port: handshake, bounded sends, one cleanup.

`ConnectionManager` accepts sockets (at most `max_connections`, `max_connections_per_ip`
from one address, and `max_handshakes_per_ip` of those still unauthenticated; an address is
counted as its `psyche_common.address_key`, so an IPv6 /64 is one address), runs the
challenge–response handshake with the server's identity (with a timeout, reading frames of at
most `HANDSHAKE_FRAME_SIZE` bytes, checked on the length prefix before anything is decoded),
which opens the connection's encrypted link (`psyche_common.protocol.secure_channel`: every
later frame both ways is encrypted and authenticated; one that fails authentication closes the
connection with a log line naming the peer), refuses a second live connection of an already
connected identity, then reads frames, validates them with a caller-supplied parser and hands
them to a handler. Until the app marks a connection `joined` (the coordinator port, after a
valid Join; never on the data-server port, whose requests are small) its frames are control
frames (`SecureChannel.read_control`'s limits: a few KiB, bounded decode); a joined
connection's may reach `max_frame_size`. A frame's rate is checked on its bytes, before it is
decoded, so a frame over the key's rate costs no decode (only its decryption, which keeps the
link's frame counter in step). Any protocol violation ends only
that connection, with a logged reason; the cleanup (unregister + `on_disconnect`) runs exactly
once per authenticated connection. Sends never block the caller: each connection's transport
buffer is bounded, and a peer that stops reading is disconnected when it fills up. Messages
of a key over its rate are dropped and a key that stays over it is disconnected
(`limits.FloodGuard`); with `idle_timeout`, a connection silent that long is closed.

Other services may share the port (`share_port`): the handshake then verifies the peer's
signature in this port's domain and in theirs, and a peer that signed in another service's
domain is handed, authenticated and with its encrypted link, to that service (the
coordinator port serves the relay this way). Such a socket leaves this port's connection and
per-IP counts once handed over; the service bounds its own connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from psyche_common.address_key import peer_key
from psyche_common.protocol import (
    CONTROL_DECODE,
    CONTROL_FRAME_SIZE,
    HANDSHAKE_FRAME_SIZE,
    ConnectionClosed,
    FrameAuthenticationError,
    HandshakeError,
    Identity,
    ProtocolError,
    SecureChannel,
    accept_handshake_in,
    decode_payload,
    encode_frame,
    encode_payload,
    short_id,
)
from psyche_common.protocol.messages import Rejected, already_connected_reason, to_wire

from .limits import ConnectionLimits, FloodGuard, RateLimiter, Verdict

__all__ = [
    "CloseConnection",
    "Connection",
    "ConnectionLimits",
    "ConnectionManager",
    "FloodGuard",
    "RateLimiter",
]

log = logging.getLogger("psyche.server.connections")


class CloseConnection(Exception):
    """Raised by a message handler to end the connection with `reason` (logged and sent)."""

    def __init__(self, reason: str, send_rejection: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.send_rejection = send_rejection


class Connection:
    """One authenticated peer. `send_frame` encrypts an encoded payload and enqueues it
    without awaiting."""

    def __init__(
        self,
        peer_id: bytes,
        remote: str,
        channel: SecureChannel,
        max_buffered_send_bytes: int,
    ) -> None:
        self.peer_id = peer_id
        self.remote = remote
        self.channel = channel
        self._writer = channel.writer
        self._max_buffered = max_buffered_send_bytes
        self.close_reason: str | None = None
        self.bytes_sent = 0
        self.frames_sent = 0
        self.joined = False
        """Set by the app once the peer sent a valid Join (only joined peers get states, and
        only their frames may be larger than a control frame)."""
        self.max_skipped_states = 0
        """0: never drop states; else how many in a row a slow reader may miss."""
        self.skipped_states = 0

    @property
    def closed(self) -> bool:
        return self.close_reason is not None

    def send_frame(self, payload: bytes) -> bool:
        """Queue one encoded (msgpack) payload, sealed for this link; closes the connection
        when the peer is not reading."""
        if self.closed:
            return False
        transport = self._writer.transport
        if transport.is_closing():
            self.close("transport closed")
            return False
        buffered = transport.get_write_buffer_size()
        if buffered + len(payload) > self._max_buffered:
            self.close(
                f"peer is not reading: {buffered} bytes already queued (limit {self._max_buffered})"
            )
            return False
        self.bytes_sent += self.channel.write_payload(payload)
        self.frames_sent += 1
        return True

    def send_state(self, frame: bytes) -> bool:
        """Queue a state frame unless much is still queued: only the latest state matters, so
        a slow reader skips states (the next tick carries a newer one) and is dropped only
        after `max_skipped_states` in a row."""
        if self.closed:
            return False
        buffered = self._writer.transport.get_write_buffer_size()
        if self.max_skipped_states and buffered > self._max_buffered // 4:
            self.skipped_states += 1
            if self.skipped_states >= self.max_skipped_states:
                self.close(
                    f"peer is not reading: {self.skipped_states} states skipped in a row "
                    f"({buffered} bytes still queued)"
                )
            return False
        self.skipped_states = 0
        return self.send_frame(frame)

    def send(self, message: dict[str, Any]) -> bool:
        return self.send_frame(encode_payload(message))

    def close(self, reason: str) -> None:
        """Close the socket (idempotent); the read loop then ends and runs the cleanup."""
        if self.close_reason is not None:
            return
        self.close_reason = reason
        transport = self._writer.transport
        if transport.get_write_buffer_size() > self._max_buffered // 2 or reason.startswith(
            "peer is not reading"
        ):
            transport.abort()
        else:
            self._writer.close()

    def __repr__(self) -> str:
        return f"Connection({short_id(self.peer_id)} @ {self.remote})"


MessageT = TypeVar("MessageT")
"""The validated message type of one port (what its parser returns and its handler takes)."""

ConnectHook = Callable[[Connection], None]

SharedService = Callable[[bytes, SecureChannel], Awaitable[None]]
"""A service sharing a port: `(peer key, its encrypted link)` after the handshake in its
domain; it owns the socket from then on."""


class ConnectionManager(Generic[MessageT]):
    """Accepts and serves the connections of one listening port."""

    def __init__(
        self,
        name: str,
        parse: Callable[[object], MessageT],
        on_message: Callable[[Connection, MessageT], Awaitable[None]],
        limits: ConnectionLimits,
        *,
        domain: bytes,
        identity: Identity | None = None,
        service: str | None = None,
        on_connect: ConnectHook | None = None,
        on_disconnect: ConnectHook | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        self.name = name
        self.identity = identity or Identity.generate()
        """The server's identity: it signs every handshake of this port (None: a new one)."""
        self.idle_timeout = idle_timeout
        """Seconds a connection may stay silent before it is closed (None: never)."""
        self.domain = domain
        """The handshake domain of this port (`psyche_common.protocol.handshake`)."""
        self.service = service or name
        """What a peer whose signature is for another service or run is told it reached."""
        self._parse = parse
        self._on_message = on_message
        self._on_connect = on_connect
        self._on_disconnect = on_disconnect
        self.limits = limits
        self.connections: dict[bytes, Connection] = {}
        self._writers: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._per_ip: dict[str, int] = {}
        self._handshaking_per_ip: dict[str, int] = {}
        self._server: asyncio.Server | None = None
        self._shared: dict[bytes, SharedService] = {}
        self.rejected_connections = 0
        self.protocol_violations = 0
        self.dropped_messages = 0

    def share_port(self, domain: bytes, service: SharedService) -> None:
        """Serve `service` on this port too: peers that sign the handshake in `domain` go
        to it (see the module docstring)."""
        if domain == self.domain:
            raise ValueError(f"{self.name}: a shared service needs its own handshake domain")
        self._shared[domain] = service

    async def start(self, host: str, port: int) -> int:
        """Bind and start accepting; returns the bound port."""
        self._server = await asyncio.start_server(self._accept, host, port, backlog=2048)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop accepting, close every connection and wait for their handlers."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections.values()):
            conn.close("server shutting down")
        for writer in list(self._writers.values()):
            writer.transport.abort()  # also the ones still in their handshake
        tasks = list(self._writers)
        if tasks:
            _, stragglers = await asyncio.wait(tasks, timeout=5)
            for task in stragglers:
                task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def broadcast_state(self, payload: bytes) -> int:
        """Send one pre-encoded state payload (sealed per link) to every joined connection
        (`send_state`); returns how many accepted it."""
        return sum(
            conn.send_state(payload) for conn in list(self.connections.values()) if conn.joined
        )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        ip = peer_key(peer)  # what the per-IP caps count: an IPv6 /64 is one address
        refusal = None
        if len(self._writers) >= self.limits.max_connections:
            refusal = f"{len(self._writers)} connections open (limit)"
        elif self._per_ip.get(ip, 0) >= self.limits.max_connections_per_ip:
            refusal = (
                f"{self._per_ip[ip]} connections open from {ip} "
                f"(--max-connections-per-ip {self.limits.max_connections_per_ip})"
            )
        elif self._handshaking_per_ip.get(ip, 0) >= self.limits.max_handshakes_per_ip:
            refusal = (
                f"{self._handshaking_per_ip[ip]} connections from {ip} still in their "
                f"handshake (--max-handshakes-per-ip {self.limits.max_handshakes_per_ip})"
            )
        if refusal is not None:
            self.rejected_connections += 1
            log.warning(
                "%s: refusing a connection from %s: %s",
                self.name,
                host,
                refusal,
                extra={"remote": host, "address_key": ip, "reason": refusal},
            )
            writer.transport.abort()
            return
        self._writers[task] = writer
        self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
        self._handshaking_per_ip[ip] = self._handshaking_per_ip.get(ip, 0) + 1
        handoff = None
        try:
            handoff = await self._serve(reader, writer, ip)
        finally:
            del self._writers[task]
            self._per_ip[ip] -= 1
            if not self._per_ip[ip]:
                del self._per_ip[ip]
        if handoff is not None:
            service, peer_id, channel = handoff
            await service(peer_id, channel)

    def _handshake_ended(self, ip: str) -> None:
        count = self._handshaking_per_ip.get(ip, 0) - 1
        if count > 0:
            self._handshaking_per_ip[ip] = count
        else:
            self._handshaking_per_ip.pop(ip, None)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ip: str
    ) -> tuple[SharedService, bytes, SecureChannel] | None:
        """Serve one socket; returns `(service, peer key, link)` when a sharing service takes
        it."""
        peer = writer.get_extra_info("peername")
        remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        limits = self.limits
        try:
            if limits.socket_send_buffer is not None:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limits.socket_send_buffer)
            accepted = await accept_handshake_in(
                reader,
                writer,
                self.identity,
                domains=(self.domain, *self._shared),
                timeout=limits.handshake_timeout,
                max_frame_size=min(limits.max_frame_size, HANDSHAKE_FRAME_SIZE),
            )
        except (ProtocolError, TimeoutError, OSError) as exc:
            reason = (
                f"no handshake within {limits.handshake_timeout:g}s"
                if isinstance(exc, TimeoutError)
                else str(exc) or type(exc).__name__
            )
            self.rejected_connections += 1
            log.warning(
                "%s: handshake failed from %s: %s",
                self.name,
                remote,
                reason,
                extra={"remote": remote, "reason": reason},
            )
            if isinstance(exc, HandshakeError):
                # tell an honest peer of another run or service why (the reason is final there)
                with contextlib.suppress(Exception):
                    writer.write(
                        encode_frame(
                            to_wire(
                                Rejected(reason=f"handshake with {self.service} failed: {reason}")
                            )
                        )
                    )
                writer.close()
            else:
                writer.transport.abort()
            return None
        finally:
            self._handshake_ended(ip)
        peer_id, channel = accepted.peer_key, accepted.channel
        if accepted.domain != self.domain:
            return self._shared[accepted.domain], peer_id, channel
        if peer_id in self.connections:
            reason = already_connected_reason(short_id(peer_id))
            self.rejected_connections += 1
            log.warning(
                "%s: refusing %s: %s",
                self.name,
                remote,
                reason,
                extra={"client": short_id(peer_id), "remote": remote, "reason": reason},
            )
            with contextlib.suppress(Exception):
                channel.write(to_wire(Rejected(reason=reason)))
            writer.close()
            return None
        conn = Connection(peer_id, remote, channel, limits.max_buffered_send_bytes)
        conn.max_skipped_states = limits.max_skipped_states
        self.connections[peer_id] = conn
        log.info(
            "%s: %s connected from %s",
            self.name,
            short_id(peer_id),
            remote,
            extra={"client": short_id(peer_id), "remote": remote},
        )
        try:
            if self._on_connect is not None:
                self._on_connect(conn)
            await self._read_loop(conn)
        finally:
            if self.connections.get(peer_id) is conn:
                del self.connections[peer_id]
            conn.close(conn.close_reason or "connection ended")
            level = logging.INFO if conn.close_reason in _ORDINARY_ENDS else logging.WARNING
            log.log(
                level,
                "%s: %s disconnected: %s",
                self.name,
                short_id(peer_id),
                conn.close_reason,
                extra={"client": short_id(peer_id), "reason": conn.close_reason},
            )
            if self._on_disconnect is not None:
                try:
                    self._on_disconnect(conn)
                except Exception:
                    log.exception("%s: disconnect handler failed for %s", self.name, conn)
        return None

    async def _read_loop(self, conn: Connection) -> None:
        limits = self.limits
        guard = FloodGuard(limits.messages_per_second, limits.message_burst)
        while not conn.closed:
            try:
                joined = conn.joined
                size = (
                    limits.max_frame_size
                    if joined
                    else min(limits.max_frame_size, CONTROL_FRAME_SIZE)
                )
                payload = await conn.channel.read_payload(size, self.idle_timeout)
                verdict = guard.check()  # before the decode: a dropped frame costs no decoding
                if verdict == Verdict.CLOSE:
                    raise CloseConnection(
                        f"key {short_id(conn.peer_id)} sent more than "
                        f"{limits.messages_per_second:g} messages/s (burst "
                        f"{limits.message_burst}) for {guard.dropped} dropped messages"
                    )
                if verdict == Verdict.DROP:
                    self._note_dropped(conn, guard)
                    continue
                message = self._parse(decode_payload(payload, None if joined else CONTROL_DECODE))
                await self._on_message(conn, message)
            except TimeoutError:
                reason = f"no message for {self.idle_timeout:g}s (idle timeout)"
                conn.send(to_wire(Rejected(reason=reason)))
                conn.close(reason)
            except ConnectionClosed:
                conn.close("peer closed the connection")
            except FrameAuthenticationError as exc:
                self.protocol_violations += 1
                log.warning(
                    "%s: closing the link of %s (%s): %s",
                    self.name,
                    short_id(conn.peer_id),
                    conn.remote,
                    exc,
                    extra={"client": short_id(conn.peer_id), "remote": conn.remote},
                )
                conn.close(f"frame failed authentication: {exc}")
            except CloseConnection as exc:
                self.protocol_violations += 1
                if exc.send_rejection:
                    conn.send(to_wire(Rejected(reason=exc.reason)))
                conn.close(exc.reason)
            except ProtocolError as exc:
                self.protocol_violations += 1
                conn.close(f"protocol violation: {exc}")
            except (OSError, asyncio.IncompleteReadError) as exc:
                conn.close(f"connection error: {exc!r}")
            except Exception as exc:  # a handler bug must not take the server down
                log.exception("%s: internal error handling a message from %s", self.name, conn)
                conn.close(f"internal server error: {type(exc).__name__}")

    def _note_dropped(self, conn: Connection, guard: FloodGuard) -> None:
        """A message over the key's rate was dropped; the first of a streak is logged."""
        self.dropped_messages += 1
        if guard.dropped_in_a_row == 1:
            log.warning(
                "%s: dropping messages from %s: over %g messages/s (burst %d)",
                self.name,
                short_id(conn.peer_id),
                self.limits.messages_per_second,
                self.limits.message_burst,
                extra={"client": short_id(conn.peer_id), "remote": conn.remote},
            )


_ORDINARY_ENDS = frozenset({"peer closed the connection", "server shutting down"})
