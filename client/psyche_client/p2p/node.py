"""`P2PNode`: one client's peer-to-peer endpoint (listener, connection pool, public API).

The node listens on its P2P port and serves member peers (its `is_member(peer_id)` callback
decides, refreshed by the app from each coordinator state) four requests on an authenticated
stream (see `connection` for the handshake, `transfer` for chunked answers):

* `Announce{announcement}` → `Ack{status, reason}`: a signed announcement, verified, checked
  that its signer is a member, de-duplicated, then handed to `on_announcement` (before the
  Ack is sent, so the callback should be quick: record it and schedule work elsewhere);
* `GetBlob{hash}` → `BlobHeader` + `Chunk`s | `NotFound`: any blob of the local store;
* `GetManifest{}` → the encoded `ModelManifest` (chunked) | `NotFound`;
* `GetParameter{name}` → one parameter's bytes (chunked) | `NotFound`.

As a client it pushes announcements to every known peer, fetches blobs from any holder
(`fetch`), and downloads parameters for `model_share`. Addresses come from `set_peers`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from psyche_common.protocol import ConnectionClosed, Identity, ProtocolError, short_id

from .announcements import Announcement, to_wire
from .blobs import BlobStore
from .config import P2PConfig
from .connection import (
    ConnectionPool,
    PeerConnection,
    PeerRefused,
    PeerUnavailable,
    accept_peer,
    advertised_host,
    dial_peer,
    parse_address,
    raise_if_rejected,
)
from .fetch import FetchError, PeerHealth, fetch_verified
from .inbox import AnnouncementCallback, AnnouncementInbox
from .manifest import ModelManifest
from .stats import TransferStats
from .transfer import Received, RemoteError, receive_bytes, send_bytes

log = logging.getLogger(__name__)

CorruptCallback = Callable[[bytes, bytes], None]


@dataclass
class AnnounceReport:
    """Outcome of pushing one announcement: peers that acknowledged it, those that failed, and
    those still being pushed when `announce_wait` ran out (the push goes on in the background)."""

    delivered: list[bytes] = field(default_factory=list)
    failed: dict[bytes, str] = field(default_factory=dict)
    pending: list[bytes] = field(default_factory=list)


class P2PNode:
    """One client's P2P endpoint: `start()`, then announce, publish and fetch; `close()`."""

    def __init__(
        self,
        identity: Identity,
        *,
        is_member: Callable[[bytes], bool],
        config: P2PConfig | None = None,
        on_announcement: AnnouncementCallback | None = None,
        on_corrupt: CorruptCallback | None = None,
        get_manifest: Callable[[], ModelManifest | None] | None = None,
        get_parameter_bytes: Callable[[str], bytes | None] | None = None,
        blobs: BlobStore | None = None,
        stats: TransferStats | None = None,
    ) -> None:
        self.identity = identity
        self.config = config or P2PConfig()
        self.blobs = blobs or BlobStore()
        self.stats = stats or TransferStats()
        self.health = PeerHealth()
        self._is_member = is_member
        self._inbox = AnnouncementInbox(
            is_member,
            on_announcement,
            self.config.max_seen_announcements,
            self.config.max_result_size,
        )
        self._serving_slots = asyncio.Semaphore(self.config.max_concurrent_serving)
        self.refused_inbound = 0
        self._on_corrupt = on_corrupt
        self._get_manifest = get_manifest
        self._get_parameter_bytes = get_parameter_bytes
        self._peers: dict[bytes, tuple[str, int]] = {}
        self._download_slots = asyncio.Semaphore(self.config.max_concurrent_downloads)
        self.parameter_slots = asyncio.Semaphore(self.config.max_concurrent_parameter_requests)
        self._inflight: dict[bytes, asyncio.Task[bytes]] = {}
        self._forwards: set[asyncio.Task[AnnounceReport]] = set()
        self._pushes: set[asyncio.Future[None]] = set()
        self._rng = random.Random()
        self._step: int | None = None
        self._server: asyncio.Server | None = None
        self._server_conns: set[PeerConnection] = set()
        self._inbound_per_ip: Counter[str] = Counter()
        self._pool = ConnectionPool(
            self._dial,
            max_connections=self.config.max_connections,
            max_idle_per_peer=self.config.max_idle_per_peer,
            idle_timeout=self.config.idle_timeout * 5 / 6,
            on_connected=self.health.record_latency,
        )

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve_connection, self.config.bind_host, self.config.port
        )
        log.info("P2P node %s listening on %s", self.identity.short_id, self.address)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        background: list[asyncio.Future[Any]] = [
            *self._inflight.values(),
            *self._forwards,
            *self._pushes,
        ]
        for task in background:
            task.cancel()
        await self._pool.close()
        for conn in list(self._server_conns):
            await conn.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> P2PNode:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def peer_id(self) -> bytes:
        return self.identity.public_key

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the P2P node is not listening; call start() first")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> str:
        """`host:port` peers should dial (what the client registers with the server)."""
        host = self.config.advertise_host or advertised_host(self.config.bind_host)
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    # ---- address book ------------------------------------------------------------------------

    def set_peers(self, peers: Mapping[bytes, str]) -> None:
        """Replace the address book (client id → `host:port`, from the coordinator broadcast).
        Invalid addresses are logged and skipped; our own id is ignored."""
        book: dict[bytes, tuple[str, int]] = {}
        for peer_id, address in peers.items():
            if peer_id == self.peer_id:
                continue
            try:
                book[bytes(peer_id)] = parse_address(address)
            except ValueError as exc:
                log.warning("ignoring peer %s: %s", short_id(peer_id), exc)
        self._peers = book

    def known_peers(self) -> list[bytes]:
        return list(self._peers)

    def set_step(self, step: int) -> None:
        """The training step the node is at: traffic is counted against it, and fetched blobs
        without an explicit `step` are tagged with it (so `forget_before` can drop them)."""
        self._step = step
        self.stats.set_step(step)

    def forget_before(self, step: int) -> None:
        """Drop blobs of steps before `step` (the app passes `current − 2`)."""
        self.blobs.prune_before(step)

    # ---- announcements -----------------------------------------------------------------------

    async def announce(
        self, announcement: Announcement, peer_ids: Iterable[bytes] | None = None
    ) -> AnnounceReport:
        """Push a signed announcement to `peer_ids` (default: every known peer), concurrently.
        Returns after at most `announce_wait` s: pushes to slower peers continue in the
        background (each bounded by `announce_timeout`). Never raises for a peer's failure; the
        report says which peers got it, failed, or were still pending."""
        wire = {"type": "Announce", "announcement": to_wire(announcement)}
        self._inbox.remember(announcement)
        targets = self.known_peers() if peer_ids is None else list(peer_ids)
        report = AnnounceReport()

        async def push(peer_id: bytes) -> None:
            try:
                async with asyncio.timeout(self.config.announce_timeout):
                    async with self._pool.connection(peer_id) as conn:
                        await conn.send(wire)
                        ack = await conn.receive(self.config.read_timeout)
                raise_if_rejected(ack, f"peer {short_id(peer_id)}")
                if ack.get("type") != "Ack":
                    raise ProtocolError(f"expected Ack, got {ack.get('type')!r}")
                if ack.get("status") == "rejected":
                    report.failed[peer_id] = f"rejected: {ack.get('reason')}"
                else:
                    report.delivered.append(peer_id)
            except TimeoutError:
                report.failed[peer_id] = f"no ack within {self.config.announce_timeout}s"
            except (OSError, ProtocolError) as exc:
                report.failed[peer_id] = f"{type(exc).__name__}: {exc}"

        pushes = {
            asyncio.ensure_future(push(peer_id)): peer_id
            for peer_id in targets
            if peer_id != self.peer_id
        }
        if pushes:
            _, slow = await asyncio.wait(pushes, timeout=self.config.announce_wait)
            for task in slow:  # a stalled peer never holds the caller: its push goes on alone
                report.pending.append(pushes[task])
                self._pushes.add(task)
                task.add_done_callback(self._pushes.discard)
        if report.failed:
            log.debug(
                "announcement not delivered to %d peer(s): %s",
                len(report.failed),
                {short_id(p): r for p, r in report.failed.items()},
            )
        return report

    def _forward(self, announcement: Announcement, came_from: bytes) -> None:
        """Gossip: pass a new announcement on to up to `gossip_fanout` random peers (never
        back to whoever sent it or signed it), in the background. Every node forwards each
        announcement once (the inbox drops duplicates), so an announcement pushed to a single
        member still reaches everyone."""
        skip = {came_from, announcement.sender_id, self.peer_id}
        candidates = [peer for peer in self.known_peers() if peer not in skip]
        fanout = min(self.config.gossip_fanout, len(candidates))
        if fanout <= 0:
            return
        targets = self._rng.sample(candidates, fanout)
        task = asyncio.ensure_future(self.announce(announcement, targets))
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)

    # ---- blobs -------------------------------------------------------------------------------

    def publish_blob(self, data: bytes, *, step: int | None = None) -> bytes:
        """Add our own blob to the store (served to peers from now on); returns its hash."""
        return self.blobs.put(data, step=step)

    async def fetch_blob(
        self,
        blob_hash: bytes,
        candidates: Iterable[bytes],
        *,
        expected_size: int | None = None,
        step: int | None = None,
        deadline: float | None = None,
    ) -> bytes:
        """Hash-checked bytes of `blob_hash` from any of `candidates` (peer ids); the blob is
        then stored and re-served, tagged with `step` (default: the step of the announcement
        that named this blob, else the step given to `set_step`) so `forget_before` drops it.
        Raises `FetchError` (its `failures` name every peer tried)."""
        held = self.blobs.get(blob_hash)
        if held is not None:
            return held
        task = self._inflight.get(blob_hash)
        if task is None:
            if step is None:
                announced = self._inbox.announced_step(blob_hash)
                step = self._step if announced is None else announced
            coro = self._fetch_blob(blob_hash, list(candidates), expected_size, step, deadline)
            task = asyncio.ensure_future(coro)
            self._inflight[blob_hash] = task
            task.add_done_callback(lambda _t: self._inflight.pop(blob_hash, None))
        return await asyncio.shield(task)

    async def _fetch_blob(
        self,
        blob_hash: bytes,
        candidates: list[bytes],
        expected_size: int | None,
        step: int | None,
        deadline: float | None,
    ) -> bytes:
        request = {"type": "GetBlob", "hash": blob_hash}

        async def attempt(peer_id: bytes) -> Received:
            return await self.request_stream(
                peer_id, request, max_size=self.config.max_blob_size, expected_size=expected_size
            )

        async with self._download_slots:
            self.stats.downloads.started += 1
            try:
                data, _ = await fetch_verified(
                    attempt,
                    blob_hash,
                    [c for c in candidates if c != self.peer_id],
                    what=f"blob {blob_hash.hex()[:16]}",
                    health=self.health,
                    deadline=deadline or self.config.fetch_deadline,
                    rounds=self.config.fetch_rounds,
                    backoff=self.config.retry_backoff,
                    on_corrupt=self.report_corrupt,
                )
            except FetchError:
                self.stats.downloads.failed += 1
                raise
        self.stats.downloads.finished += 1
        self.blobs.put_verified(blob_hash, data, step=step)
        return data

    def report_corrupt(self, peer_id: bytes, expected_hash: bytes) -> None:
        self.stats.downloads.corrupt += 1
        log.warning(
            "peer %s served corrupted bytes for %s", short_id(peer_id), expected_hash.hex()[:16]
        )
        if self._on_corrupt is not None:
            self._on_corrupt(peer_id, expected_hash)

    # ---- requests to one peer ----------------------------------------------------------------

    async def request_stream(
        self,
        peer_id: bytes,
        request: dict[str, Any],
        *,
        max_size: int,
        expected_size: int | None = None,
    ) -> Received:
        """Send `request` to `peer_id` and read its chunked answer (not hash-checked here)."""
        async with self._pool.connection(peer_id) as conn:
            await conn.send(request)
            return await receive_bytes(
                conn,
                max_size=max_size,
                read_timeout=self.config.read_timeout,
                expected_size=expected_size,
            )

    async def _dial(self, peer_id: bytes) -> PeerConnection:
        address = self._peers.get(peer_id)
        if address is None:
            raise PeerUnavailable(f"no P2P address known for peer {short_id(peer_id)}")
        return await dial_peer(
            peer_id,
            *address,
            self.identity,
            self.stats,
            connect_timeout=self.config.connect_timeout,
            handshake_timeout=self.config.read_timeout,
            max_frame_size=self.config.max_frame_size,
        )

    # ---- serving -----------------------------------------------------------------------------

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
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
        conn = PeerConnection(
            b"", reader, writer, self.stats, self.config.max_frame_size, self.config.read_timeout
        )
        self._server_conns.add(conn)
        self._inbound_per_ip[ip] += 1
        try:
            peer_id = await accept_peer(
                conn, self.identity, self._is_member, self.config.read_timeout
            )
            while True:
                try:
                    request = await conn.receive(self.config.idle_timeout)
                except (TimeoutError, ConnectionClosed):
                    return
                if not self._is_member(peer_id):
                    reason = f"peer {short_id(peer_id)} is no longer a member"
                    await conn.send({"type": "Rejected", "reason": reason})
                    return
                if request.get("type") == "Announce":
                    await self._handle(conn, peer_id, request)
                    continue
                async with self._serving_slots, asyncio.timeout(self.config.fetch_deadline):
                    await self._handle(conn, peer_id, request)
        except PeerRefused as exc:
            log.info("refused P2P connection from %s: %s", remote, exc)
        except (ProtocolError, OSError, TimeoutError) as exc:
            log.info("closed P2P connection from %s: %s: %s", remote, type(exc).__name__, exc)
        finally:
            self._server_conns.discard(conn)
            self._inbound_per_ip[ip] -= 1
            if self._inbound_per_ip[ip] <= 0:
                del self._inbound_per_ip[ip]
            await conn.close()

    async def _handle(self, conn: PeerConnection, peer_id: bytes, request: dict[str, Any]) -> None:
        kind = request.get("type")
        if kind == "Announce":
            receipt = await self._inbox.receive(peer_id, request.get("announcement"))
            await conn.send({"type": "Ack", "status": receipt.status, "reason": receipt.reason})
            if receipt.announcement is not None:
                self._forward(receipt.announcement, came_from=peer_id)
        elif kind == "GetBlob":
            digest = request.get("hash")
            data = self.blobs.get(digest) if isinstance(digest, bytes) else None
            await self._answer(conn, "blob", digest, data)
        elif kind == "GetManifest":
            data = await self._call_provider("manifest", self._encoded_manifest)
            await self._answer(conn, "manifest", b"", data)
        elif kind == "GetParameter":
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

    async def _answer(self, conn: PeerConnection, kind: str, key: Any, data: bytes | None) -> None:
        if data is None:
            await conn.send({"type": "NotFound", "reason": f"no such {kind} here"})
            return
        await send_bytes(conn, self._outgoing_bytes(kind, key, data), self.config.chunk_size)

    def _outgoing_bytes(self, kind: str, key: Any, data: bytes) -> bytes:
        """The bytes served for a request (tests override this to simulate a corrupt peer)."""
        return data
