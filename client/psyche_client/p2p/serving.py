"""Serving peers: inbound connections, and the requests a peer sends over any link.

Mixed into `P2PNode`. An inbound connection is authenticated (`connection.accept_peer`), then
becomes a link like the ones we dial: the peer's requests on it are answered here, and our own
requests to that peer use it too (`links.LinkTable`). Each request is checked against the
current membership (a peer dropped from the epoch gets `Rejected` and the link closes), served
within `fetch_deadline`; at most `max_inbound_connections` inbound connections are open, at
most `max_inbound_per_ip` from one address, and at most `max_concurrent_serving` blob, manifest or parameter
requests are served at once (announcements are not held by that bound). A failing app callback
is logged and answered as `NotFound`; a protocol error closes only that peer's link.
Manifest and parameter answers are bulk streams (they yield to the round's traffic and pass
the upload cap, see `pacing`); while a blob is being answered, bulk frames wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from psyche_common.protocol import ConnectionClosed, Identity, ProtocolError, short_id

from .announcements import Announcement
from .blobs import BlobStore
from .config import P2PConfig
from .connection import PeerConnection, PeerRefused, accept_peer
from .fetch import PeerHealth
from .inbox import AnnouncementInbox
from .link import PeerLink, Stream
from .links import LinkTable
from .manifest import ModelManifest
from .pacing import UploadShaper
from .recent import RecentAnnouncements
from .stats import TransferStats
from .transfer import RemoteError, send_bytes

log = logging.getLogger(__name__)


class ServingMixin:
    """The serving half of `P2PNode` (its attributes are set by `P2PNode.__init__`)."""

    identity: Identity
    config: P2PConfig
    blobs: BlobStore
    stats: TransferStats
    shaper: UploadShaper
    refused_inbound: int
    _is_member: Callable[[bytes], bool]
    _inbox: AnnouncementInbox
    _serving_slots: asyncio.Semaphore
    _server_conns: set[PeerConnection]
    _inbound_per_ip: Counter[str]
    _background: set[asyncio.Future[Any]]
    _pool: LinkTable
    health: PeerHealth
    recent: RecentAnnouncements
    _get_manifest: Callable[[], ModelManifest | None] | None
    _get_parameter_bytes: Callable[[str], bytes | None] | None

    def _new_link(self, conn: PeerConnection, *, dialed: bool, relayed: bool) -> PeerLink:
        raise NotImplementedError

    def _forward(self, announcement: Announcement, came_from: bytes) -> None:
        raise NotImplementedError

    # ---- serving -----------------------------------------------------------------------------

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """An inbound connection: the handshake, then a link serving (and carrying our
        requests to the dialer) until it closes."""
        remote = writer.get_extra_info("peername")
        if len(self._server_conns) >= self.config.max_inbound_connections:
            self.refused_inbound += 1
            log.warning(
                "refusing P2P connection from %s: %d inbound connections open "
                "(max_inbound_connections)",
                remote,
                len(self._server_conns),
            )
            writer.transport.abort()
            return
        ip = str(remote[0]) if isinstance(remote, tuple) and remote else "?"
        if self._inbound_per_ip[ip] >= self.config.max_inbound_per_ip:
            self.refused_inbound += 1
            log.warning(
                "refusing P2P connection from %s: %d inbound connections open from that "
                "address (max_inbound_per_ip)",
                remote,
                self._inbound_per_ip[ip],
            )
            writer.transport.abort()
            return
        self._inbound_per_ip[ip] += 1
        try:
            await self._serve_inbound(reader, writer, remote)
        finally:
            self._inbound_per_ip[ip] -= 1
            if self._inbound_per_ip[ip] <= 0:
                del self._inbound_per_ip[ip]

    async def accept_relayed(
        self, peer_id: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A pipe that `peer_id` opened to us through the server's relay: served like an
        inbound connection (the P2P handshake must then prove that `peer_id` is at the other
        end). Relayed pipes all come from the server's address, so no per-IP cap applies."""
        if len(self._server_conns) >= self.config.max_inbound_connections:
            self.refused_inbound += 1
            log.warning(
                "refusing a relayed P2P connection from %s: %d inbound connections open "
                "(max_inbound_connections)",
                short_id(peer_id),
                len(self._server_conns),
            )
            writer.transport.abort()
            return
        await self._serve_inbound(reader, writer, f"{short_id(peer_id)} (relayed)", peer_id)

    async def _serve_inbound(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        remote: object,
        expected_peer: bytes | None = None,
    ) -> None:
        conn = PeerConnection(
            b"", reader, writer, self.stats, self.config.max_frame_size, self.config.read_timeout
        )
        self._server_conns.add(conn)
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
            link = self._new_link(conn, dialed=False, relayed=expected_peer is not None)
            self._pool.add(link)
            await link.start()
        except PeerRefused as exc:
            log.info("refused P2P connection from %s: %s", remote, exc)
        except ConnectionClosed as exc:
            if link is None:  # e.g. the server's reachability probe, which only connects
                log.debug("P2P connection from %s closed during the handshake: %s", remote, exc)
            else:
                log.info("P2P connection from %s closed: %s", remote, exc)
        except (ProtocolError, OSError, TimeoutError) as exc:
            log.info("closed P2P connection from %s: %s: %s", remote, type(exc).__name__, exc)
        finally:
            self._server_conns.discard(conn)
            if link is not None:
                self._pool.discard(link)
                await link.close()
            await conn.close()

    def _on_request(self, link: PeerLink, stream: Stream, request: dict[str, Any]) -> None:
        task = asyncio.ensure_future(self._serve_stream(link, stream, request))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _serve_stream(self, link: PeerLink, stream: Stream, request: dict[str, Any]) -> None:
        """Answer one request of `link`'s peer (whoever dialed the link)."""
        peer_id = link.peer_id
        try:
            if not self._is_member(peer_id):
                reason = f"peer {short_id(peer_id)} is no longer a member"
                await stream.send({"type": "Rejected", "reason": reason})
                await link.close()
                return
            if request.get("type") == "Announce":
                await self._handle(stream, peer_id, request)
                return
            async with self._serving_slots, asyncio.timeout(self.config.fetch_deadline):
                await self._handle(stream, peer_id, request)
        except (ProtocolError, OSError, TimeoutError) as exc:
            log.info(
                "closed P2P connection with %s: %s: %s", short_id(peer_id), type(exc).__name__, exc
            )
            await link.close(abort=True)
        finally:
            stream.close()

    async def _handle(self, conn: Stream, peer_id: bytes, request: dict[str, Any]) -> None:
        kind = request.get("type")
        if kind == "Announce":
            receipt = await self._inbox.receive(peer_id, request.get("announcement"))
            await conn.send({"type": "Ack", "status": receipt.status, "reason": receipt.reason})
            if receipt.announcement is not None:
                self.recent.add(receipt.announcement)
                self._forward(receipt.announcement, came_from=peer_id)
        elif kind == "GetBlob":
            digest = request.get("hash")
            data = self.blobs.get(digest) if isinstance(digest, bytes) else None
            with self.shaper.urgent():  # model shares yield to a round's result meanwhile
                await self._answer(conn, "blob", digest, data)
        elif kind == "GetManifest":
            conn.bulk = True
            data = await self._call_provider("manifest", self._encoded_manifest)
            await self._answer(conn, "manifest", b"", data)
        elif kind == "GetParameter":
            conn.bulk = True
            name = request.get("name")
            data = None
            if isinstance(name, str) and self._get_parameter_bytes is not None:
                provider = self._get_parameter_bytes
                data = await self._call_provider(
                    f"parameter {name!r}", lambda: provider(name), in_thread=True
                )
            await self._answer(conn, "parameter", name, data)
        else:
            await conn.send({"type": "Error", "reason": f"unknown request type {kind!r}"})
            raise RemoteError(f"peer {short_id(peer_id)} sent unknown request {kind!r}")

    def _encoded_manifest(self) -> bytes | None:
        manifest = self._get_manifest() if self._get_manifest is not None else None
        return None if manifest is None else manifest.encode()

    async def _call_provider(
        self, what: str, provider: Callable[[], bytes | None], in_thread: bool = False
    ) -> bytes | None:
        """Run an app callback; a failing callback is logged and answered as "not held"."""
        try:
            return await asyncio.to_thread(provider) if in_thread else provider()
        except Exception:
            log.exception("serving %s to a peer failed", what)
            return None

    async def _answer(self, conn: Stream, kind: str, key: Any, data: bytes | None) -> None:
        if data is None:
            await conn.send({"type": "NotFound", "reason": f"no such {kind} here"})
            return
        chunk = self.config.chunk_size
        if conn.bulk:
            chunk = self.shaper.bulk_chunk(chunk)
        await send_bytes(conn, self._outgoing_bytes(kind, key, data), chunk)

    def _outgoing_bytes(self, kind: str, key: Any, data: bytes) -> bytes:
        """The bytes served for a request (tests override this to simulate a corrupt peer)."""
        return data
