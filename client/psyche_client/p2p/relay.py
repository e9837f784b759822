"""`RelayClient`: this client's use of the server's relay (pipes to peers nothing else reaches).

The server says where its relay listens (`Reachability.relay_port`, on the coordinator's host).
The client then keeps a *listen channel* open there (reconnecting after 1, 2, 4 … 30 s with
jitter, pinging every `PING_INTERVAL`), so peers can reach it through the relay; for every
`RelayIncoming` pushed on it, it opens the second end of the pipe and hands it to
`on_incoming(peer, reader, writer)` (the P2P node, which runs the listener side of the P2P
handshake on it). `open_pipe(peer)` asks for a pipe to a peer and returns it once the peer
took its end; the caller runs the dialer side of the P2P handshake on it. The control frames
(`psyche_common.protocol.relay_messages`) travel on the encrypted link of the relay
handshake (with `server_key`, only to a relay proving the server's key); after
`RelayConnected` the relay only copies bytes, so every pipe carries the same end-to-end
encrypted and authenticated P2P protocol as a direct connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from psyche_common.protocol import (
    Identity,
    ProtocolError,
    SecureChannel,
    connect_handshake,
    relay_domain,
    short_id,
)
from psyche_common.protocol.relay_messages import expect, parse_incoming

from .connection import PeerUnavailable

log = logging.getLogger(__name__)

PING_INTERVAL = 20.0
CONTROL_FRAME_SIZE = 4096
IncomingHandler = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RelayClient:
    """Listen channel and pipes at one relay (see the module docstring)."""

    def __init__(
        self,
        identity: Identity,
        host: str,
        port: int,
        run_id: str,
        on_incoming: IncomingHandler,
        *,
        connect_timeout: float = 5.0,
        accept_timeout: float = 15.0,
        server_key: bytes | None = None,
    ) -> None:
        self.identity = identity
        self.server_key = server_key
        self.host = host
        self.port = port
        self._domain = relay_domain(run_id)
        self._on_incoming = on_incoming
        self._connect_timeout = connect_timeout
        self._accept_timeout = accept_timeout
        self.listening = False
        """Whether the listen channel is open (peers can reach us through the relay)."""
        self._tasks: set[asyncio.Future[Any]] = set()
        self._listener: asyncio.Task[None] | None = None
        self._retry_now = asyncio.Event()
        self._closed = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        """Keep the listen channel open in the background (until `close`)."""
        if self._listener is None:
            self._listener = asyncio.ensure_future(self._listen_forever())

    def retry_now(self) -> None:
        """Reopen a closed listen channel now instead of after its backoff (e.g. the client
        has just joined a restarted server, which refused it while it was not joined)."""
        if not self.listening:
            self._retry_now.set()

    async def close(self) -> None:
        self._closed = True
        self.listening = False
        tasks = [*self._tasks, *([self._listener] if self._listener else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def open_pipe(self, peer_id: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A pipe to `peer_id` through the relay (raises `PeerUnavailable` naming why not)."""
        where = f"{short_id(peer_id)} through the relay at {self.address}"
        channel = await self._connect({"type": "RelayDial", "peer": peer_id}, where)
        try:
            frame = await channel.read_control(
                self._accept_timeout + self._connect_timeout, CONTROL_FRAME_SIZE
            )
            connected = expect(frame, "RelayConnected")
            if connected.get("peer") != peer_id:
                raise ProtocolError("the relay connected us to another peer")
        except (ProtocolError, OSError, TimeoutError) as exc:
            channel.abort()
            raise PeerUnavailable(f"cannot reach {where}: {exc}") from exc
        return channel.reader, channel.writer

    async def _connect(self, request: dict[str, Any], where: str) -> SecureChannel:
        """A new authenticated connection to the relay with `request` sent on it."""
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, TimeoutError) as exc:
            raise PeerUnavailable(f"cannot connect to {where}: {exc}") from exc
        try:
            channel = await connect_handshake(
                reader,
                writer,
                self.identity,
                domain=self._domain,
                timeout=self._connect_timeout,
                max_frame_size=CONTROL_FRAME_SIZE,
                server_key=self.server_key,
            )
            channel.write(request)
        except (ProtocolError, OSError, TimeoutError) as exc:
            writer.transport.abort()
            raise PeerUnavailable(f"cannot reach {where}: {exc}") from exc
        return channel

    async def _listen_forever(self) -> None:
        backoff = 0.0
        while not self._closed:
            try:
                await self._listen_once()
                backoff = 0.0  # it was up: the next failure retries soon
            except (ProtocolError, OSError, TimeoutError) as exc:
                log.info("relay listen channel at %s: %s", self.address, exc)
            self.listening = False
            backoff = min(30.0, max(1.0, backoff * 2))
            self._retry_now.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff * random.uniform(0.8, 1.2)):
                    await self._retry_now.wait()

    async def _listen_once(self) -> None:
        channel = await self._connect({"type": "RelayListen"}, f"relay {self.address}")
        try:
            expect(
                await channel.read_control(self._connect_timeout, CONTROL_FRAME_SIZE),
                "RelayListening",
            )
            self.listening = True
            log.info("listening for peers through the relay at %s", self.address)
            pinger = asyncio.ensure_future(self._ping(channel))
            try:
                while True:
                    peer, token = parse_incoming(
                        await channel.read_control(None, CONTROL_FRAME_SIZE)
                    )
                    self._spawn(self._take_pipe(peer, token))
            finally:
                pinger.cancel()
        finally:
            channel.abort()

    async def _ping(self, channel: SecureChannel) -> None:
        with contextlib.suppress(OSError):
            while True:
                await asyncio.sleep(PING_INTERVAL)
                channel.write({"type": "Ping"})

    async def _take_pipe(self, peer_id: bytes, token: bytes) -> None:
        where = f"the relay pipe from {short_id(peer_id)}"
        try:
            channel = await self._connect({"type": "RelayAccept", "token": token}, where)
        except PeerUnavailable as exc:
            log.info("%s", exc)
            return
        try:
            frame = await channel.read_control(self._connect_timeout, CONTROL_FRAME_SIZE)
            connected = expect(frame, "RelayConnected")
            if connected.get("peer") != peer_id:
                raise ProtocolError("the relay connected us to another peer")
        except (ProtocolError, OSError, TimeoutError) as exc:
            log.info("%s failed: %s", where, exc)
            channel.abort()
            return
        await self._on_incoming(peer_id, channel.reader, channel.writer)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
