"""`InboundAcceptor`: connections peers open to us (directly or through the relay) become links.

An inbound connection is authenticated (`connection.accept_peer`), then becomes a link like
the ones we dial: the peer's requests on it are answered (`serving`), and our own requests to
that peer use it too (`links.LinkTable`). At most `max_inbound_connections` inbound connections
are open, at most `max_inbound_per_ip` from one address (more are closed at accept, before any
handshake; an address counts as its `psyche_common.address_key`, so an IPv6 /64 is one); a
pipe through the server's relay counts against the first bound only (every pipe comes from the
server's address), and its P2P handshake must prove the key the relay named.

A part of `P2PNode`, which passes in its collaborators (identity, settings, counters, the
membership check, the link table and how to make a link).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from psyche_common.address_key import peer_key
from psyche_common.protocol import ConnectionClosed, Identity, ProtocolError, short_id

from .config import P2PConfig
from .connection import PeerConnection, PeerRefused, ProbeAnswered, accept_peer
from .fetch import PeerHealth
from .link import PeerLink
from .links import LinkTable
from .stats import TransferStats

log = logging.getLogger(__name__)

NewLink = Callable[[PeerConnection, bool], PeerLink]
"""Make a link of an accepted connection: `(connection, relayed)`."""


class InboundAcceptor:
    """Accepts peers' connections (see the module docstring)."""

    def __init__(
        self,
        identity: Identity,
        config: P2PConfig,
        stats: TransferStats,
        health: PeerHealth,
        *,
        is_member: Callable[[bytes], bool],
        pool: LinkTable,
        new_link: NewLink,
    ) -> None:
        self.identity = identity
        self.config = config
        self.stats = stats
        self.health = health
        self._is_member = is_member
        self._pool = pool
        self._new_link = new_link
        self.conns: set[PeerConnection] = set()
        """Inbound connections open now (in their handshake or serving as links)."""
        self.refused = 0
        """Connections refused at accept (over a cap)."""
        self._per_ip: Counter[str] = Counter()

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """An inbound socket (the listener's callback): caps, handshake, then a link serving
        (and carrying our requests to the dialer) until it closes."""
        remote = writer.get_extra_info("peername")
        if self._over_total(remote):
            writer.transport.abort()
            return
        ip = peer_key(remote) if remote else "?"  # an IPv6 /64 counts as one address
        if self._per_ip[ip] >= self.config.max_inbound_per_ip:
            self.refused += 1
            log.warning(
                "refusing P2P connection from %s: %d inbound connections open from %s "
                "(max_inbound_per_ip)",
                remote,
                self._per_ip[ip],
                ip,
            )
            writer.transport.abort()
            return
        self._per_ip[ip] += 1
        try:
            await self._serve(reader, writer, remote)
        finally:
            self._per_ip[ip] -= 1
            if self._per_ip[ip] <= 0:
                del self._per_ip[ip]

    async def accept_relayed(
        self, peer_id: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A pipe that `peer_id` opened to us through the server's relay: served like an
        inbound connection (the P2P handshake must then prove that `peer_id` is at the other
        end). Relayed pipes all come from the server's address, so no per-IP cap applies."""
        remote = f"{short_id(peer_id)} (relayed)"
        if self._over_total(remote):
            writer.transport.abort()
            return
        await self._serve(reader, writer, remote, peer_id)

    async def close(self) -> None:
        for conn in list(self.conns):
            await conn.close()

    def _over_total(self, remote: object) -> bool:
        if len(self.conns) < self.config.max_inbound_connections:
            return False
        self.refused += 1
        log.warning(
            "refusing P2P connection from %s: %d inbound connections open "
            "(max_inbound_connections)",
            remote,
            len(self.conns),
        )
        return True

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        remote: object,
        expected_peer: bytes | None = None,
    ) -> None:
        conn = PeerConnection(
            b"", reader, writer, self.stats, self.config.max_frame_size, self.config.read_timeout
        )
        self.conns.add(conn)
        link: PeerLink | None = None
        try:
            started = time.monotonic()
            peer_id = await accept_peer(
                conn, self.identity, self._is_member, self.config.read_timeout
            )
            if expected_peer is not None and peer_id != expected_peer:
                raise PeerRefused(
                    f"the relay announced {short_id(expected_peer)} but {short_id(peer_id)} "
                    "connected"
                )
            # the handshake's round trips stand for the connect latency we did not measure:
            # fetches try peers by latency, and a peer known only through the link it
            # dialed must not sort after every measured one
            self.health.record_latency(peer_id, time.monotonic() - started)
            link = self._new_link(conn, expected_peer is not None)
            self._pool.add(link)
            await link.start()
        except ProbeAnswered:
            log.debug("answered the server's reachability probe from %s", remote)
        except PeerRefused as exc:
            log.info("refused P2P connection from %s: %s", remote, exc)
        except ConnectionClosed as exc:
            if link is None:
                log.debug("P2P connection from %s closed during the handshake: %s", remote, exc)
            else:
                log.info("P2P connection from %s closed: %s", remote, exc)
        except (ProtocolError, OSError, TimeoutError) as exc:
            log.info("closed P2P connection from %s: %s: %s", remote, type(exc).__name__, exc)
        finally:
            self.conns.discard(conn)
            if link is not None:
                self._pool.discard(link)
                await link.close()
            await conn.close()
