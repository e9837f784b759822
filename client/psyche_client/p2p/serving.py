"""`RequestServer`: answering the requests a peer sends over any link, whoever dialed it.

Each request is checked against the current membership (a peer dropped from the epoch gets
`Rejected` and the link closes) and served within `fetch_deadline`; at most
`max_concurrent_serving` blob, manifest or parameter requests are served at once, and for one
peer at most `max_serving_per_peer` blob requests plus as many manifest and parameter requests
(its further requests wait for one of its own slots before they take a shared one, so a member
reading blobs slowly holds a few slots, never all of them, and a fresh result stays fetchable
by everyone else). The two kinds have separate per-peer slots, so a joiner's request for a
round's result never waits behind its own model download. Announcements are not held
by either bound. A failing app callback is logged and answered as
`NotFound`; a protocol error closes only that peer's link. Manifest and parameter answers are
bulk streams (they yield to the round's traffic and pass the upload cap, see `pacing`); while a
blob is being answered, bulk frames wait.

A part of `P2PNode`, which passes in its collaborators: the membership check, the blob store,
the announcement inbox, the recent announcements, the upload shaper, how to forward a new
announcement, the app's model providers, and the `handle` / `answer` / `outgoing` steps (the
node's overridable methods, which call this part's own; tests override them to make a slow
or corrupt peer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from psyche_common.announcements import Announcement
from psyche_common.protocol import ProtocolError, short_id

from .blobs import BlobStore
from .config import P2PConfig
from .inbox import AnnouncementInbox
from .keyed_slots import KeyedSlots
from .link import PeerLink, Stream
from .manifest import ModelManifest
from .pacing import UploadShaper
from .recent import RecentAnnouncements
from .transfer import RemoteError, send_bytes

log = logging.getLogger(__name__)

Handle = Callable[[Stream, bytes, dict[str, Any]], Awaitable[None]]
Answer = Callable[[Stream, str, Any, "bytes | None"], Awaitable[None]]
Outgoing = Callable[[str, Any, bytes], bytes]


BULK_REQUESTS = frozenset({"GetManifest", "GetParameter"})
"""Requests answered with the model (bulk streams); the others are a round's traffic."""


class RequestServer:
    """Answers peers' requests (see the module docstring)."""

    def __init__(
        self,
        config: P2PConfig,
        *,
        is_member: Callable[[bytes], bool],
        blobs: BlobStore,
        inbox: AnnouncementInbox,
        recent: RecentAnnouncements,
        shaper: UploadShaper,
        forward: Callable[[Announcement, bytes], None],
        get_manifest: Callable[[], ModelManifest | None] | None,
        get_parameter_bytes: Callable[[str], bytes | None] | None,
        holds_model: Callable[[], bool] | None = None,
        handle: Handle | None = None,
        answer: Answer | None = None,
        outgoing: Outgoing | None = None,
    ) -> None:
        self.config = config
        self.blobs = blobs
        self.shaper = shaper
        self._is_member = is_member
        self._inbox = inbox
        self._recent = recent
        self._forward = forward
        self._get_manifest = get_manifest
        self._get_parameter_bytes = get_parameter_bytes
        self._holds_model = holds_model or (lambda: False)
        self._handle = handle or self.handle
        self._answer = answer or self.answer
        self._outgoing = outgoing or (lambda _kind, _key, data: data)
        self._slots = asyncio.Semaphore(config.max_concurrent_serving)
        self._peer_slots = KeyedSlots[tuple[bytes, bool]](config.max_serving_per_peer)
        """(peer, bulk) → that peer's slots for blob (bulk False) or model (True) requests."""
        self._tasks: set[asyncio.Future[None]] = set()

    def on_request(self, link: PeerLink, stream: Stream, request: dict[str, Any]) -> None:
        """A link's callback for a peer's new request: served in the background."""
        task = asyncio.ensure_future(self._serve_stream(link, stream, request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

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
            async with asyncio.timeout(self.config.fetch_deadline):
                bulk = request.get("type") in BULK_REQUESTS
                async with self._peer_slot(peer_id, bulk), self._slots:
                    await self._handle(stream, peer_id, request)
        except (ProtocolError, OSError, TimeoutError) as exc:
            log.info(
                "closed P2P connection with %s: %s: %s", short_id(peer_id), type(exc).__name__, exc
            )
            await link.close(abort=True)
        finally:
            stream.close()

    def _peer_slot(
        self, peer_id: bytes, bulk: bool
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """One of `peer_id`'s `max_serving_per_peer` slots for blob requests, or for model
        (bulk) requests."""
        return self._peer_slots.slot((peer_id, bulk))

    def serving(self, peer_id: bytes) -> int:
        """Requests of `peer_id` being served or waiting for a slot now."""
        return sum(self._peer_slots.users((peer_id, bulk)) for bulk in (False, True))

    async def handle(self, conn: Stream, peer_id: bytes, request: dict[str, Any]) -> None:
        """Answer one request (`Announce`, `GetBlob`, `GetManifest`, `GetParameter`)."""
        kind = request.get("type")
        if kind == "Announce":
            receipt = await self._inbox.receive(peer_id, request.get("announcement"))
            await conn.send({"type": "Ack", "status": receipt.status, "reason": receipt.reason})
            if receipt.announcement is not None:
                self._recent.add(receipt.announcement)
                self._forward(receipt.announcement, peer_id)
        elif kind == "GetBlob":
            digest = request.get("hash")
            data = self.blobs.get(digest) if isinstance(digest, bytes) else None
            with self.shaper.urgent():  # model shares yield to a round's result meanwhile
                await self._answer(conn, "blob", digest, data)
        elif kind == "GetManifest":
            conn.bulk = True
            data = await self._call_provider("manifest", self._encoded_manifest)
            if data is None and self._holds_model():
                # a member that will share: a joiner's vote waits for it (`model_share`)
                await conn.send(
                    {"type": "NotShared", "reason": "holds the weights, shares none yet"}
                )
            else:
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

    async def answer(self, conn: Stream, kind: str, key: Any, data: bytes | None) -> None:
        """`NotFound`, or `data` as a header and chunks (bulk-sized for a bulk stream)."""
        if data is None:
            await conn.send({"type": "NotFound", "reason": f"no such {kind} here"})
            return
        chunk = self.config.chunk_size
        if conn.bulk:
            chunk = self.shaper.bulk_chunk(chunk)
        await send_bytes(conn, self._outgoing(kind, key, data), chunk)
