"""`P2PNode`: one client's peer-to-peer endpoint (listener, connection pool, public API).

The node listens on its P2P port and serves member peers (its `is_member(peer_id)` callback
decides, refreshed by the app from each coordinator state) four requests on an authenticated
stream (see `connection` for the handshake, `transfer` for chunked answers):

* `Announce{announcement}` → `Ack{status, reason}`: a signed announcement, de-duplicated
  (before any signature check), checked that its signer is a member, charged to the pushing
  peer's rate, verified, then handed to `on_announcement` as a
  `VerifiedAnnouncement` (before the Ack is sent, so the callback should be quick: record it
  and schedule work elsewhere);
* `GetBlob{hash}` → `BlobHeader` + `Chunk`s | `NotFound`: any blob of the local store;
* `GetManifest{}` → the encoded `ModelManifest` (chunked) | `NotShared` (it holds the run's
  weights, `holds_model()`, but shares none yet) | `NotFound`;
* `GetParameter{name}` → one parameter's bytes (chunked) | `NotFound`.

As a client it pushes announcements to every known peer, fetches blobs from any holder
(`fetch`), and downloads parameters for `model_share`. Addresses come from `set_peers`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from psyche_common.announcements import Announcement
from psyche_common.protocol import Identity, short_id

from .blobs import BlobStore
from .config import P2PConfig
from .connection import (
    PeerConnection,
    advertised_host,
    parse_address,
)
from .dialer import Dialer
from .fetch import FetchError, PeerHealth, fetch_verified
from .inbound import InboundAcceptor
from .inbox import AnnouncementCallback, AnnouncementInbox
from .keyed_slots import KeyedSlots
from .link import PeerLink, Stream
from .links import LinkTable
from .manifest import ModelManifest
from .outbound import OutboundLinks
from .pacing import UploadShaper
from .pushing import Announcer, AnnounceReport
from .rate import FrameRate, PeerRates
from .recent import RecentAnnouncements
from .relay import RelayClient
from .serving import RequestServer
from .stats import TransferStats
from .transfer import Received, receive_bytes

log = logging.getLogger(__name__)

CorruptCallback = Callable[[bytes, bytes], None]


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
        holds_model: Callable[[], bool] | None = None,
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
            PeerRates(self.config.announcement_rate, self.config.announcement_burst),
            signer_rates=PeerRates(self.config.announcement_rate, self.config.announcement_burst),
        )
        self.shaper = UploadShaper(self.config.max_upload_rate)
        self._on_corrupt = on_corrupt
        self._peers: dict[bytes, tuple[str, int]] = {}
        self._download_slots = asyncio.Semaphore(self.config.max_concurrent_downloads)
        self._source_slots = KeyedSlots[bytes](self.config.max_downloads_per_source)
        """The first candidate of a fetch (the announcer) → its share of the download slots."""
        self.parameter_slots = asyncio.Semaphore(self.config.max_concurrent_parameter_requests)
        self._inflight: dict[bytes, asyncio.Task[bytes]] = {}
        self._step: int | None = None
        self._server: asyncio.Server | None = None
        self._background: set[asyncio.Future[Any]] = set()
        self._unreachable: set[bytes] = set()
        self.authorizers: Mapping[bytes, bytes] = {}
        """Member → authorizer of the delegates of a permissioned run, from the broadcast:
        the manifest votes count one vote per listed key with its delegates."""
        self._dialer = Dialer(
            identity,
            self.config,
            self.stats,
            address_of=lambda peer: self._peers.get(peer),
            is_unreachable=lambda peer: peer in self._unreachable,
        )
        self.recent = RecentAnnouncements()
        self._pool = LinkTable(
            self._dial,
            own_id=identity.public_key,
            max_links=self.config.max_connections,
            reuse_within=self.config.idle_timeout * 5 / 6,
            keep=lambda: self.outbound_only,
            on_connected=self.health.record_latency,
            on_new_link=lambda peer: self._outbound.catch_up(peer),
        )
        self._announcer = Announcer(
            self.config,
            own_id=identity.public_key,
            pool=self._pool,
            inbox=self._inbox,
            recent=self.recent,
            targets=self.reachable_peers,
        )
        self._outbound = OutboundLinks(
            self._pool,
            own_id=identity.public_key,
            peers=lambda: self._peers,
            unreachable=lambda: self._unreachable,
            has_relay=lambda: self.relay is not None,
            recent=self.recent,
            push=self.announce,
        )
        self.inbound = InboundAcceptor(
            identity,
            self.config,
            self.stats,
            self.health,
            is_member=is_member,
            pool=self._pool,
            new_link=lambda conn, relayed: self._new_link(conn, dialed=False, relayed=relayed),
        )
        self._requests = RequestServer(
            self.config,
            is_member=is_member,
            blobs=self.blobs,
            inbox=self._inbox,
            recent=self.recent,
            shaper=self.shaper,
            forward=self._forward,
            get_manifest=get_manifest,
            get_parameter_bytes=get_parameter_bytes,
            holds_model=holds_model,
            handle=lambda conn, peer, request: self._handle(conn, peer, request),
            answer=lambda conn, kind, key, data: self._answer(conn, kind, key, data),
            outgoing=lambda kind, key, data: self._outgoing_bytes(kind, key, data),
        )

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self.inbound.serve_connection, self.config.bind_host, self.config.port
        )
        log.info("P2P node %s listening on %s", self.identity.short_id, self.address)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._outbound.close()  # no more dials or catch-up pushes
        await self._announcer.close()
        await self._pool.close()  # links end their readers and their requests first
        await self.inbound.close()
        await self._requests.close()
        background: list[asyncio.Future[Any]] = [
            *self._inflight.values(),
            *self._background,
        ]
        for task in background:
            task.cancel()
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
        port = self.config.advertise_port or self.port
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    # ---- reachability ------------------------------------------------------------------------

    def set_outbound_only(self, outbound_only: bool) -> None:
        """Whether this node accepts no connections from peers (behind NAT, firewalled): it
        then dials every peer, keeps those links open (pinged) and is served through them."""
        self._outbound.set_outbound_only(outbound_only)

    @property
    def outbound_only(self) -> bool:
        return self._outbound.outbound_only

    def connected_peers(self) -> list[bytes]:
        """Peers with an open link (dialed by either side)."""
        return self._pool.connected_peers()

    def is_reachable(self, peer_id: bytes) -> bool:
        """False for a peer the server found unreachable (nobody dials its address)."""
        return peer_id not in self._unreachable

    def link_state(self, peer_id: bytes) -> str:
        """The connection in use to `peer_id`: "we dialed", "they dialed" or "none", with
        " (relayed)" for a pipe through the server's relay."""
        link = self._pool.live(peer_id)
        if link is None:
            return "none"
        state = "we dialed" if link.dialed else "they dialed"
        return f"{state} (relayed)" if link.relayed else state

    # ---- address book ------------------------------------------------------------------------

    def set_peers(self, peers: Mapping[bytes, str], unreachable: Iterable[bytes] = ()) -> None:
        """Replace the address book (client id → `host:port`, from the coordinator broadcast).
        Invalid addresses are logged and skipped; our own id is ignored. `unreachable` peers
        accept no connections: nobody dials them, they are served over the links they open.
        An outbound-only node (`set_outbound_only`) then dials every peer it has no link to."""
        book: dict[bytes, tuple[str, int]] = {}
        for peer_id, address in peers.items():
            if peer_id == self.peer_id:
                continue
            try:
                book[bytes(peer_id)] = parse_address(address)
            except ValueError as exc:
                log.warning("ignoring peer %s: %s", short_id(peer_id), exc)
        self._peers = book
        self._unreachable = {bytes(peer) for peer in unreachable} - {self.peer_id}
        self._outbound.peers_changed()

    def known_peers(self) -> list[bytes]:
        return list(self._peers)

    def reachable_peers(self) -> list[bytes]:
        """Peers we can push to: those in the address book, and members with a link open to
        us whose address the server has not handed out yet (it does once its probe ends)."""
        linked = [p for p in self._pool.connected_peers() if p not in self._peers]
        return [*self._peers, *(p for p in linked if self._is_member(p))]

    def set_step(self, step: int) -> None:
        """The training step the node is at: traffic is counted against it, and fetched blobs
        without an explicit `step` are tagged with it (so `forget_before` can drop them)."""
        self._step = step
        self.stats.set_step(step)

    def forget_before(self, step: int) -> None:
        """Drop blobs and remembered announcements of steps before `step` (the app passes
        `current − 2`)."""
        self.blobs.prune_before(step)
        self.recent.prune_before(step)

    # ---- announcements -----------------------------------------------------------------------

    async def announce(
        self, announcement: Announcement, peer_ids: Iterable[bytes] | None = None
    ) -> AnnounceReport:
        """Push a signed announcement to `peer_ids` (default: `reachable_peers()`); see
        `pushing.Announcer.announce`."""
        return await self._announcer.announce(announcement, peer_ids)

    def _forward(self, announcement: Announcement, came_from: bytes) -> None:
        self._announcer.forward(announcement, came_from)

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
                peer_id,
                request,
                max_size=self.config.max_blob_size,
                expected_size=expected_size,
                min_rate=self.config.min_blob_rate,
            )

        # charged to the announcer (the caller's first candidate) before a shared slot: a
        # member whose blobs arrive slowly holds at most its own few, never every slot
        source = candidates[0] if candidates else b""
        async with self._source_slots.slot(source), self._download_slots:
            self.stats.downloads.started += 1
            try:
                data, _ = await fetch_verified(
                    attempt,
                    blob_hash,
                    [c for c in candidates if c != self.peer_id],
                    what=f"blob {blob_hash.hex()[:16]}",
                    health=self.health,
                    deadline=deadline or self.config.fetch_deadline,
                    # the caller's order (the announcer, the one sure holder, first): with one
                    # long-lived link per peer, latencies are measured once, and a stalled
                    # peer that measured fastest would be asked first for every blob
                    prefer_fast=False,
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
        min_rate: float | None = None,
    ) -> Received:
        """Send `request` to `peer_id` and read its chunked answer (not hash-checked here);
        `min_rate`: the slowest average bytes/s it may arrive at (`receive_bytes`)."""
        async with self._pool.connection(peer_id) as conn:
            await conn.send(request)
            return await receive_bytes(
                conn,
                max_size=max_size,
                read_timeout=self.config.read_timeout,
                expected_size=expected_size,
                min_rate=min_rate,
            )

    async def _dial(self, peer_id: bytes) -> PeerLink:
        """A new link to `peer_id`: direct, or through the relay (`dialer`)."""
        conn, relayed = await self._dialer.connect(peer_id)
        link = self._new_link(conn, dialed=True, relayed=relayed)
        reader = link.start()
        self._background.add(reader)
        reader.add_done_callback(self._background.discard)
        reader.add_done_callback(lambda _t: self._pool.discard(link))
        return link

    @property
    def relay(self) -> RelayClient | None:
        """The server's relay, if it offers one (`use_relay`)."""
        return self._dialer.relay

    def use_relay(self, relay: RelayClient | None) -> None:
        """Reach peers that accept no connections (and peers a direct dial fails to reach)
        through `relay`, whose listen channel also lets such peers reach us. None: no relay."""
        self._dialer.relay = relay
        self._outbound.peers_changed()

    def _new_link(self, conn: PeerConnection, *, dialed: bool, relayed: bool) -> PeerLink:
        """A link over `conn`. An outbound-only node keeps it open (pinged) while it is the
        peer's link in use: a duplicate from simultaneous dials closes once idle."""
        link = PeerLink(
            conn,
            dialed=dialed,
            relayed=relayed,
            on_request=self._requests.on_request,
            idle_timeout=self.config.idle_timeout,
            max_streams=self.config.max_concurrent_serving * 2,
            keep=lambda: self.outbound_only and self._pool.in_use(link),
            shaper=self.shaper,
            frame_rate=FrameRate(
                self.config.link_frame_rate, self.config.link_frame_burst, time.monotonic()
            ),
        )
        return link

    # ---- serving (the request server's steps, overridable) -----------------------------------

    async def accept_relayed(
        self, peer_id: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A pipe `peer_id` opened to us through the server's relay (`inbound`)."""
        await self.inbound.accept_relayed(peer_id, reader, writer)

    @property
    def refused_inbound(self) -> int:
        """Inbound connections refused at accept (over a cap)."""
        return self.inbound.refused

    async def _handle(self, conn: Stream, peer_id: bytes, request: dict[str, Any]) -> None:
        await self._requests.handle(conn, peer_id, request)

    async def _answer(self, conn: Stream, kind: str, key: Any, data: bytes | None) -> None:
        await self._requests.answer(conn, kind, key, data)

    def _outgoing_bytes(self, kind: str, key: Any, data: bytes) -> bytes:
        """The bytes served for a request (tests override this to simulate a corrupt peer)."""
        return data
