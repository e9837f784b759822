"""`RelayServer`: pipes between clients that cannot connect to each other (both behind NAT).

By default the relay shares the coordinator port: a client that signs the port's
handshake in `relay_domain(run_id)` rather than the coordinator's domain is handed to the
relay (`serve_authenticated`; `ConnectionManager.share_port`), so an operator opens one port
and the relay never collides with another service's. `psyche-server run --relay-port PORT`
gives it a port of its own instead (`start`), with the same handshake (signed with the
server's identity) and the same encrypted link (`SecureChannel`) for every control frame. The
frames are in `psyche_common.protocol.relay_messages`. Only joined clients may use it
(`is_member`, asked at every request), and a pipe joins two members of the current epoch only
(`in_epoch`: their P2P listeners refuse anyone else anyway, so a pipe from a client that only
joined would be useless, and would count against its target's quota). A client that may be
dialed keeps a listen channel open; a client that wants a pipe sends `RelayDial{peer}`, the
server pushes
`RelayIncoming{peer, token}` on the peer's listen channel, the peer connects with
`RelayAccept{token}`, and the server copies bytes between the two sockets (`relay_pipe`),
paced to `max_mbps` over all pipes together, in round-robin turns per sending client
(`pacing.FairBytePacer`), and counted per client. The two clients then run
the end-to-end authenticated and encrypted P2P protocol through the pipe, so the relay cannot read keys it
could misuse nor impersonate a client.

Bounds (`relay_quota`): pipes, open or still waiting for their second end, per key dialed
from and, apart, dialed to, per (dialer, target) pair, per dialing address, per address and
target and in all; `max_connections` sockets and
`max_connections_per_ip` from one address (an address counts as its
`psyche_common.address_key`: an IPv6 /64 is one address); a handshake and a request within
`handshake_timeout` (control frames: a few KiB, bounded decode), the second end within
`accept_timeout`, and listen channels closed after `listen_idle_timeout` without a `Ping`.
Every refusal is logged with the reason and the limit's flag. `forget(client)` (the client
left the coordinator) closes its channel and pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from psyche_common.address_key import peer_key
from psyche_common.pacing import FairBytePacer
from psyche_common.protocol import (
    Identity,
    ProtocolError,
    SecureChannel,
    accept_handshake,
    relay_domain,
    short_id,
)
from psyche_common.protocol.relay_messages import TOKEN_SIZE, parse_request

from .relay_pipe import Pipe, RelayStats
from .relay_quota import PipeQuota, RelayLimits

__all__ = ["RelayLimits", "RelayServer"]

log = logging.getLogger("psyche.server.relay")

CONTROL_FRAME_SIZE = 4096


@dataclass
class _AcceptedEnd:
    """The second end of a pipe, handed to the dialer's task, which sets `finished` when the
    pipe is over (the accepting connection's task waits for it)."""

    channel: SecureChannel
    finished: asyncio.Future[None]


@dataclass
class _PendingDial:
    target: bytes
    arrived: asyncio.Future[_AcceptedEnd] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class RelayServer:
    """The relay port of a server (see the module docstring)."""

    def __init__(
        self,
        run_id: str,
        is_member: Callable[[bytes], bool],
        limits: RelayLimits | None = None,
        *,
        in_epoch: Callable[[bytes], bool] | None = None,
        identity: Identity | None = None,
    ) -> None:
        self.run_id = run_id
        self.identity = identity or Identity.generate()
        """The server's identity (it signs the handshakes on the relay's own port)."""
        self.limits = limits or RelayLimits()
        self.stats = RelayStats()
        self._is_member = is_member
        self._in_epoch = in_epoch or is_member
        self.quota = PipeQuota(self.limits)
        self._per_ip: Counter[str] = Counter()
        self._domain = relay_domain(run_id)
        self._pacer = FairBytePacer.from_mbps(self.limits.max_mbps)
        self._listeners: dict[bytes, SecureChannel] = {}
        self._pending: dict[bytes, _PendingDial] = {}
        self._pipes: set[Pipe] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._closed = False
        self.port: int | None = None

    @property
    def domain(self) -> bytes:
        """The handshake domain clients sign to reach the relay."""
        return self._domain

    async def start(self, host: str, port: int) -> int:
        """Listen on a port of the relay's own (`--relay-port`); returns the bound port."""
        self._server = await asyncio.start_server(self._accept, host, port, backlog=1024)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("relay listening on %s:%d", host, self.port, extra={"relay_port": self.port})
        return self.port

    def serve_on_shared_port(self, port: int) -> None:
        """The relay is reached on `port`, which another listener shares with it (it hands
        over the sockets whose handshake named the relay: `serve_authenticated`)."""
        self.port = port
        log.info("relay shares the coordinator port %d", port, extra={"relay_port": port})

    async def close(self) -> None:
        self._closed = True
        if self._server is not None:
            self._server.close()
        if self.port is not None:  # it served, on its own port or on the coordinator's
            log.info(
                "relay: forwarded %d bytes through %d pipe(s) in all",
                self.stats.forwarded,
                self.stats.pipes_total,
                extra={
                    "relay_forwarded_bytes": self.stats.forwarded,
                    "relay_pipes": self.stats.pipes_total,
                },
            )
        for writer in list(self._writers):
            writer.transport.abort()
        for pipe in list(self._pipes):
            pipe.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def forget(self, client_id: bytes) -> None:
        """`client_id` left the run: close its listen channel and every pipe it is an end of."""
        channel = self._listeners.pop(client_id, None)
        if channel is not None:
            channel.abort()
        for pipe in list(self._pipes):
            if client_id in pipe.ends:
                pipe.close()

    def pipes_of(self, client_id: bytes) -> int:
        """Pipes `client_id` is an end of, open or pending."""
        return self.quota.of_key(client_id)

    @property
    def open_pipes(self) -> int:
        return len(self._pipes)

    # ---- connections ---------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A socket on the relay's own port: the handshake, then `serve_authenticated`."""
        ip = self._admit(writer)
        if ip is None:
            return
        try:
            async with asyncio.timeout(self.limits.handshake_timeout):
                accepted = await accept_handshake(
                    reader,
                    writer,
                    self.identity,
                    domain=self._domain,
                    max_frame_size=CONTROL_FRAME_SIZE,
                )
        except (ProtocolError, OSError, TimeoutError) as exc:
            log.info("relay: handshake from %s failed: %s: %s", ip, type(exc).__name__, exc)
            self._release(writer, ip)
            writer.close()
            return
        await self._serve(accepted.peer_key, ip, accepted.channel)

    async def serve_authenticated(self, client: bytes, channel: SecureChannel) -> None:
        """A socket whose handshake `client` signed in the relay's domain on a shared port."""
        ip = self._admit(channel.writer)
        if ip is not None:
            await self._serve(client, ip, channel)

    def _admit(self, writer: asyncio.StreamWriter) -> str | None:
        """The key the socket's address counts under (`address_key.peer_key`: an IPv6 /64 is
        one address), or None when it is over a connection cap (then closed)."""
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
        ip = peer_key(peer)
        limits = self.limits
        refusal = None
        if self._closed:
            refusal = "the relay is closing"
        elif len(self._writers) >= limits.max_connections:
            refusal = f"{len(self._writers)} relay connections open (the server's limit)"
        elif self._per_ip[ip] >= limits.max_connections_per_ip:
            refusal = (
                f"{self._per_ip[ip]} relay connections open from {ip} "
                f"(--relay-max-connections-per-ip {limits.max_connections_per_ip})"
            )
        if refusal is not None:
            self.stats.refused += 1
            log.warning(
                "relay: refusing a connection from %s: %s",
                host,
                refusal,
                extra={"remote": host, "address_key": ip, "reason": refusal},
            )
            writer.transport.abort()
            return None
        self._writers.add(writer)
        self._per_ip[ip] += 1
        return ip

    def _release(self, writer: asyncio.StreamWriter, ip: str) -> None:
        self._writers.discard(writer)
        self._per_ip[ip] -= 1
        if self._per_ip[ip] <= 0:
            del self._per_ip[ip]

    async def _serve(self, client: bytes, ip: str, channel: SecureChannel) -> None:
        """One authenticated relay connection: its request, then what the request asks."""
        writer = channel.writer
        try:
            kind, argument = parse_request(
                await channel.read_control(self.limits.handshake_timeout, CONTROL_FRAME_SIZE)
            )
            if not self._is_member(client):
                raise _Refusal(f"{short_id(client)} is not a joined client of this run")
            if kind == "RelayListen":
                await self._listen(client, channel)
            elif kind == "RelayDial":
                await self._dial(client, ip, argument, channel)
            else:
                await self._accept_pipe(client, argument, channel)
        except _Refusal as exc:
            self.stats.refused += 1
            log.warning(
                "relay: refused %s (from %s): %s",
                short_id(client),
                ip,
                exc,
                extra={"client": short_id(client), "remote": ip, "reason": str(exc)},
            )
            with contextlib.suppress(Exception):
                channel.write({"type": "Rejected", "reason": str(exc)})
        except (ProtocolError, OSError, TimeoutError) as exc:
            log.info(
                "relay: connection of %s ended: %s: %s", short_id(client), type(exc).__name__, exc
            )
        finally:
            self._release(writer, ip)
            writer.close()

    async def _listen(self, client: bytes, channel: SecureChannel) -> None:
        old = self._listeners.get(client)
        if old is not None:
            old.abort()
        self._listeners[client] = channel
        channel.write({"type": "RelayListening"})
        try:
            while True:
                frame = await channel.read_control(
                    self.limits.listen_idle_timeout, CONTROL_FRAME_SIZE
                )
                if not isinstance(frame, dict) or frame.get("type") != "Ping":
                    raise ProtocolError("a listen channel carries only Ping frames")
        finally:
            if self._listeners.get(client) is channel:
                del self._listeners[client]

    async def _dial(self, client: bytes, ip: str, target: bytes, link: SecureChannel) -> None:
        if target == client:
            raise _Refusal("a client cannot dial itself")
        if not self._is_member(target):
            raise _Refusal(f"{short_id(target)} is not a joined client of this run")
        if not self._in_epoch(client):
            raise _Refusal(
                f"{short_id(client)} is not a member of the current epoch (pipes join members)"
            )
        if not self._in_epoch(target):
            raise _Refusal(f"{short_id(target)} is not a member of the current epoch")
        channel = self._listeners.get(target)
        if channel is None or channel.writer.is_closing():
            raise _Refusal(f"{short_id(target)} has no listen channel open at the relay")
        refusal = self.quota.refusal(client, target, ip)
        if refusal is not None:
            raise _Refusal(refusal)
        claim = self.quota.claim(client, target, ip)  # a pending dial holds its slot
        try:
            await self._connect(client, target, channel, link)
        finally:
            self.quota.release(claim)

    async def _connect(
        self,
        client: bytes,
        target: bytes,
        channel: SecureChannel,
        link: SecureChannel,
    ) -> None:
        """Announce the pipe on the target's listen channel, wait for its end, run the pipe."""
        token = secrets.token_bytes(TOKEN_SIZE)
        pending = _PendingDial(target)
        self._pending[token] = pending
        try:
            channel.write({"type": "RelayIncoming", "peer": client, "token": token})
            try:
                async with asyncio.timeout(self.limits.accept_timeout):
                    end = await asyncio.shield(pending.arrived)
            except TimeoutError as exc:
                raise _Refusal(
                    f"{short_id(target)} did not take the pipe within "
                    f"{self.limits.accept_timeout:g}s"
                ) from exc
        finally:
            self._pending.pop(token, None)
            if not pending.arrived.done():
                pending.arrived.cancel()
        pipe = Pipe(
            (client, link),
            (target, end.channel),
            self._pacer,
            self.stats,
            idle_timeout=self.limits.pipe_idle_timeout,
        )
        try:
            self._pipes.add(pipe)
            self.stats.pipes_total += 1
            log.info("relay: pipe %s ↔ %s open", short_id(client), short_id(target))
            await pipe.run()
        finally:
            self._pipes.discard(pipe)
            if not end.finished.done():
                end.finished.set_result(None)
            log.info(
                "relay: pipe %s ↔ %s closed after %d bytes",
                short_id(client),
                short_id(target),
                pipe.forwarded,
            )

    async def _accept_pipe(self, client: bytes, token: bytes, channel: SecureChannel) -> None:
        pending = self._pending.get(token)
        if pending is None or pending.arrived.done():
            raise _Refusal("unknown or expired relay token")
        if pending.target != client:
            raise _Refusal("the relay token was issued to another client")
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending.arrived.set_result(_AcceptedEnd(channel, finished))
        await finished  # the dialer's task runs the pipe; this end only waits for it to end


class _Refusal(Exception):
    """A request the relay refuses (the reason is sent to the client)."""
