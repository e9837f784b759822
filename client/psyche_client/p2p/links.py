"""`LinkTable`: at most one link in use per peer, whoever opened it.

`connection(peer_id)` opens a stream on the peer's link: the one the peer dialed to us, or the
one we dialed, or a new dial (concurrent callers share it). A peer that cannot be dialed (it is
known to accept no connections) and has no link to us fails at once, naming it.

When both sides dialed at the same time the pair has two links for a moment; both ends then
prefer the one dialed by the peer with the smaller id, and the other one, no longer used for
new streams, closes when idle. Links we dialed and left unused for 5/6 of the idle timeout are
not reused (the other end may be closing them) unless we keep them open (`keep`); links the
peer dialed are used as long as they are open.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from psyche_common.protocol import ProtocolError, short_id

from .connection import PeerUnavailable
from .link import PeerLink, Stream
from .transfer import NotHeld, RemoteError

Dial = Callable[[bytes], Awaitable[PeerLink]]
NORMAL_ANSWERS = (NotHeld, RemoteError)
"""Errors that are answers of a healthy peer: the link stays open."""


class LinkTable:
    """The node's links by peer id (see the module docstring)."""

    def __init__(
        self,
        dial: Dial,
        *,
        own_id: bytes,
        max_links: int,
        reuse_within: float,
        keep: Callable[[], bool],
        on_connected: Callable[[bytes, float], None] | None = None,
        on_new_link: Callable[[bytes], None] | None = None,
    ) -> None:
        self._dial = dial
        self._own_id = own_id
        self._max_links = max_links
        self._reuse_within = reuse_within
        self._keep = keep
        self._on_connected = on_connected
        self._on_new_link = on_new_link
        self._links: dict[bytes, PeerLink] = {}
        self._dials: dict[bytes, asyncio.Future[PeerLink]] = {}
        self._closed = False

    def live(self, peer_id: bytes) -> PeerLink | None:
        """The peer's link in use, if it is open."""
        link = self._links.get(peer_id)
        return link if link is not None and link.usable else None

    def in_use(self, link: PeerLink) -> bool:
        """Whether `link` is its peer's link in use (not a duplicate that lost to another)."""
        return self._links.get(link.peer_id) is link

    def connected_peers(self) -> list[bytes]:
        return [peer for peer, link in self._links.items() if link.usable]

    def dialing(self, peer_id: bytes) -> bool:
        return peer_id in self._dials

    def add(self, link: PeerLink) -> None:
        """Register a link (dialed by us or accepted); keeps the preferred one per peer.
        `on_new_link(peer)` runs when the peer had no open link before."""
        current = self.live(link.peer_id)
        if current is None or _preferred(link, current, self._own_id):
            self._links[link.peer_id] = link
        if current is None and self._on_new_link is not None:
            self._on_new_link(link.peer_id)

    def discard(self, link: PeerLink) -> None:
        if self._links.get(link.peer_id) is link:
            del self._links[link.peer_id]

    async def get(self, peer_id: bytes) -> PeerLink:
        """The peer's link, dialing one if needed (one dial per peer at a time)."""
        if self._closed:
            raise PeerUnavailable("the P2P node is closed")
        link = self.live(peer_id)
        if link is not None and (
            self._keep() or not link.dialed or link.idle_for() < self._reuse_within
        ):
            return link  # a link the peer dialed is its to keep or close: always used
        if link is not None:
            self.discard(link)
            await link.close()
        pending = self._dials.get(peer_id)
        if pending is None:
            if len(self.connected_peers()) >= self._max_links:
                raise PeerUnavailable(
                    f"cannot connect to {short_id(peer_id)}: {self._max_links} connections open"
                )
            pending = asyncio.ensure_future(self._dial_and_add(peer_id))
            self._dials[peer_id] = pending
            pending.add_done_callback(lambda _f: self._dials.pop(peer_id, None))
        return await asyncio.shield(pending)

    async def _dial_and_add(self, peer_id: bytes) -> PeerLink:
        started = time.monotonic()
        link = await self._dial(peer_id)
        if self._on_connected is not None:
            self._on_connected(peer_id, time.monotonic() - started)
        self.add(link)
        return link

    @contextlib.asynccontextmanager
    async def connection(self, peer_id: bytes) -> AsyncIterator[Stream]:
        """A new stream to `peer_id`. A timeout or protocol error inside closes the link (the
        next request dials afresh); a peer's normal refusals (`NotFound`, `Error`) do not."""
        link = await self.get(peer_id)
        stream = link.open_stream()
        try:
            yield stream
        except NORMAL_ANSWERS:
            raise
        except (TimeoutError, ProtocolError, OSError):
            self.discard(link)
            await link.close(abort=True)
            raise
        finally:
            stream.close()

    async def drop_peer(self, peer_id: bytes) -> None:
        link = self._links.pop(peer_id, None)
        if link is not None:
            await link.close()

    async def close(self) -> None:
        self._closed = True
        for pending in list(self._dials.values()):
            pending.cancel()
        for peer_id in list(self._links):
            await self.drop_peer(peer_id)


def _preferred(new: PeerLink, current: PeerLink, own_id: bytes) -> bool:
    """Whether `new` should replace `current` for the same peer: the link dialed by the side
    with the smaller id wins, so both ends pick the same one."""
    if new.dialed == current.dialed:
        return True  # a fresh link of the same kind replaces a stale one
    dialer_of_new = own_id if new.dialed else new.peer_id
    return dialer_of_new < (new.peer_id if new.dialed else own_id)
