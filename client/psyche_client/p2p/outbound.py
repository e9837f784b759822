"""Outbound-only nodes: dialing every peer, keeping the links, catching new links up.

Mixed into `P2PNode`. A node that accepts no connections (behind NAT; the server's
`Reachability` verdict says so) is marked `set_outbound_only(True)`: it then dials every known
peer that has no link to us (a peer that is itself unreachable only through the server's
relay, and only from the smaller id of the two), every `LINK_CHECK` seconds and on
every new peer list, retrying a failed dial after 1, 2, 4 … 30 s; its links are kept open
(pinged, see `link`). Whenever a link to a peer comes up (dialed by either side), the node
pushes that peer the announcements of the recent steps (`recent`): it may have had no link
when they were pushed or forwarded.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from psyche_common.protocol import ProtocolError, short_id

from .links import LinkTable
from .recent import RecentAnnouncements

if TYPE_CHECKING:
    from .announcements import Announcement
    from .node import AnnounceReport
    from .relay import RelayClient

log = logging.getLogger(__name__)

LINK_CHECK = 1.0
"""Seconds between an outbound-only node's checks for peers it has no link to."""


class OutboundMixin:
    """The outbound-only half of `P2PNode` (its attributes are set by `P2PNode.__init__`)."""

    recent: RecentAnnouncements
    _pool: LinkTable
    _peers: dict[bytes, tuple[str, int]]
    _unreachable: set[bytes]
    _outbound_only: bool
    _maintainer: asyncio.Future[None] | None
    _redial: dict[bytes, tuple[float, float]]
    _background: set[asyncio.Future[Any]]

    @property
    def relay(self) -> RelayClient | None:
        raise NotImplementedError

    @property
    def peer_id(self) -> bytes:
        raise NotImplementedError

    async def announce(self, announcement: Announcement, peer_ids: Any = None) -> AnnounceReport:
        raise NotImplementedError

    def set_outbound_only(self, outbound_only: bool) -> None:
        """Whether this node accepts no connections from peers (behind NAT, firewalled): it
        then dials every peer, keeps those links open (pinged) and is served through them."""
        if outbound_only != self._outbound_only:
            log.info(
                "P2P: %s",
                "not reachable by peers: dialing every peer and keeping those connections"
                if outbound_only
                else "reachable by peers",
            )
        self._outbound_only = outbound_only
        if outbound_only and self._maintainer is None:
            self._maintainer = asyncio.ensure_future(self._maintain_forever())
            self._background.add(self._maintainer)

    async def _maintain_forever(self) -> None:
        """While outbound-only: (re)dial every peer without a link, every `LINK_CHECK` s."""
        try:
            while self._outbound_only:
                self._maintain_links()
                await asyncio.sleep(LINK_CHECK)
        finally:
            self._maintainer = None

    @property
    def outbound_only(self) -> bool:
        return self._outbound_only

    def connected_peers(self) -> list[bytes]:
        """Peers with an open link (dialed by either side)."""
        return self._pool.connected_peers()

    def _maintain_links(self) -> None:
        """Dial every known peer without a link (with a per-peer backoff). A peer that accepts
        no connections either is reached through the relay, if there is one: of such a pair
        the one with the smaller id opens the pipe (the other gets it)."""
        now = asyncio.get_running_loop().time()
        for peer_id in self._peers:
            if self._pool.live(peer_id) is not None:
                continue
            if peer_id in self._unreachable and (self.relay is None or peer_id < self.peer_id):
                continue
            next_try, backoff = self._redial.get(peer_id, (0.0, 0.0))
            if now < next_try or self._pool.dialing(peer_id):
                continue
            self._redial[peer_id] = (now + 3600.0, backoff)  # until this dial ends
            task = asyncio.ensure_future(self._open_link(peer_id, backoff))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _open_link(self, peer_id: bytes, backoff: float) -> None:
        now = asyncio.get_running_loop().time
        try:
            await self._pool.get(peer_id)
        except (ProtocolError, OSError, TimeoutError) as exc:
            backoff = min(30.0, max(1.0, backoff * 2))
            self._redial[peer_id] = (now() + backoff, backoff)
            log.info("P2P: cannot open a connection to %s: %s", short_id(peer_id), exc)
            return
        self._redial[peer_id] = (0.0, 0.0)

    def _catch_up(self, peer_id: bytes) -> None:
        """A link to `peer_id` came up: push it the recent announcements, in the background
        (it may have had no link when they were pushed or forwarded; it drops duplicates)."""
        pending = self.recent.all()
        if not pending:
            return

        async def push() -> None:
            for announcement in pending:
                report = await self.announce(announcement, [peer_id])
                if report.failed:
                    return  # the link is gone again: its next link-up catches up

        task = asyncio.ensure_future(push())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def is_reachable(self, peer_id: bytes) -> bool:
        """False for a peer the server found unreachable (nobody dials it)."""
        return peer_id not in self._unreachable

    def link_state(self, peer_id: bytes) -> str:
        """The connection in use to `peer_id`: "we dialed", "they dialed" or "none", with
        " (relayed)" for a pipe through the server's relay."""
        link = self._pool.live(peer_id)
        if link is None:
            return "none"
        state = "we dialed" if link.dialed else "they dialed"
        return f"{state} (relayed)" if link.relayed else state
