"""`OutboundLinks`: an outbound-only node dials every peer, keeps the links, catches them up.

A node that accepts no connections (behind NAT; the server's `Reachability` verdict says so)
is marked `set_outbound_only(True)`: it then dials every known peer that has no link to us (a
peer that is itself unreachable only through the server's relay, and only from the smaller id
of the two), every `LINK_CHECK` seconds and on every new peer list, retrying a failed dial
after 1, 2, 4 … 30 s; its links are kept open (pinged, see `link`). Whenever a link to a peer
comes up (dialed by either side, outbound-only or not), the node pushes that peer the
announcements of the recent steps (`recent`): it may have had no link when they were pushed
or forwarded.

A part of `P2PNode`, which passes in its collaborators: the link table, its address book and
unreachable set (as callables: the node replaces them on every peer list), whether a relay is
in use, and how to push announcements.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from psyche_common.announcements import Announcement
from psyche_common.protocol import ProtocolError, short_id

from .links import LinkTable
from .recent import RecentAnnouncements

log = logging.getLogger(__name__)

LINK_CHECK = 1.0
"""Seconds between an outbound-only node's checks for peers it has no link to."""

Push = Callable[[Announcement, list[bytes]], Awaitable[Any]]
"""Push announcements to peers; returns a report with a `failed` mapping (`P2PNode.announce`)."""


class OutboundLinks:
    """Links an outbound-only node keeps to every peer (see the module docstring)."""

    def __init__(
        self,
        pool: LinkTable,
        *,
        own_id: bytes,
        peers: Callable[[], Iterable[bytes]],
        unreachable: Callable[[], set[bytes]],
        has_relay: Callable[[], bool],
        recent: RecentAnnouncements,
        push: Push,
    ) -> None:
        self._pool = pool
        self._own_id = own_id
        self._peers = peers
        self._unreachable = unreachable
        self._has_relay = has_relay
        self._recent = recent
        self._push = push
        self.outbound_only = False
        self._redial: dict[bytes, tuple[float, float]] = {}  # peer -> (next try, backoff)
        self._maintainer: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Future[Any]] = set()

    def set_outbound_only(self, outbound_only: bool) -> None:
        """Whether this node accepts no connections from peers (behind NAT, firewalled): it
        then dials every peer, keeps those links open (pinged) and is served through them."""
        if outbound_only != self.outbound_only:
            log.info(
                "P2P: %s",
                "not reachable by peers: dialing every peer and keeping those connections"
                if outbound_only
                else "reachable by peers",
            )
        self.outbound_only = outbound_only
        if outbound_only and self._maintainer is None:
            self._maintainer = self._spawn(self._maintain_forever())

    def peers_changed(self) -> None:
        """A new peer list (or relay): an outbound-only node dials the new peers at once."""
        if self.outbound_only:
            self.maintain()

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _maintain_forever(self) -> None:
        """While outbound-only: (re)dial every peer without a link, every `LINK_CHECK` s."""
        try:
            while self.outbound_only:
                self.maintain()
                await asyncio.sleep(LINK_CHECK)
        finally:
            self._maintainer = None

    def maintain(self) -> None:
        """Dial every known peer without a link (with a per-peer backoff). A peer that accepts
        no connections either is reached through the relay, if there is one: of such a pair
        the one with the smaller id opens the pipe (the other gets it)."""
        now = asyncio.get_running_loop().time()
        unreachable = self._unreachable()
        for peer_id in list(self._peers()):
            if self._pool.live(peer_id) is not None:
                continue
            if peer_id in unreachable and (not self._has_relay() or peer_id < self._own_id):
                continue
            next_try, backoff = self._redial.get(peer_id, (0.0, 0.0))
            if now < next_try or self._pool.dialing(peer_id):
                continue
            self._redial[peer_id] = (now + 3600.0, backoff)  # until this dial ends
            self._spawn(self._open_link(peer_id, backoff))

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

    def catch_up(self, peer_id: bytes) -> None:
        """A link to `peer_id` came up: push it the recent announcements, in the background
        (it may have had no link when they were pushed or forwarded; it drops duplicates)."""
        pending = self._recent.all()
        if not pending:
            return

        async def push() -> None:
            for announcement in pending:
                report = await self._push(announcement, [peer_id])
                if report.failed:
                    return  # the link is gone again: its next link-up catches up

        self._spawn(push())

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
