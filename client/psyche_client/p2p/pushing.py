"""`Announcer`: pushing signed announcements to peers, and forwarding new ones (gossip).

`announce()` pushes to the given peers (default: every peer we can push to) concurrently, each
push bounded by `announce_timeout`, and returns after at most `announce_wait` seconds with an
`AnnounceReport`: pushes to slower peers go on in the background, so a stalled peer never
holds the caller's round. `forward()` passes an announcement the node accepted on to up to
`gossip_fanout` random peers, never back to whoever sent or signed it; every node forwards each
announcement once (the inbox drops duplicates), so one pushed to a single member still reaches
everyone.

A part of `P2PNode`, which passes in the link table, the inbox and recent announcements, and
who to push to.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from psyche_common.announcements import Announcement, to_wire
from psyche_common.protocol import ProtocolError, short_id

from .config import P2PConfig
from .connection import raise_if_rejected
from .inbox import AnnouncementInbox
from .links import LinkTable
from .recent import RecentAnnouncements

log = logging.getLogger(__name__)


@dataclass
class AnnounceReport:
    """Outcome of pushing one announcement: peers that acknowledged it, those that failed, and
    those still being pushed when `announce_wait` ran out (the push goes on in the background)."""

    delivered: list[bytes] = field(default_factory=list)
    failed: dict[bytes, str] = field(default_factory=dict)
    pending: list[bytes] = field(default_factory=list)


class Announcer:
    """Pushes and forwards announcements (see the module docstring)."""

    def __init__(
        self,
        config: P2PConfig,
        *,
        own_id: bytes,
        pool: LinkTable,
        inbox: AnnouncementInbox,
        recent: RecentAnnouncements,
        targets: Callable[[], list[bytes]],
    ) -> None:
        self.config = config
        self._own_id = own_id
        self._pool = pool
        self._inbox = inbox
        self._recent = recent
        self._targets = targets
        self._rng = random.Random()
        self._tasks: set[asyncio.Future[Any]] = set()

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def announce(
        self, announcement: Announcement, peer_ids: Iterable[bytes] | None = None
    ) -> AnnounceReport:
        """Push a signed announcement to `peer_ids` (default: the node's `reachable_peers()`).
        Returns after at most `announce_wait` s: pushes to slower peers continue in the
        background (each bounded by `announce_timeout`). Never raises for a peer's failure; the
        report says which peers got it, failed, or were still pending."""
        wire = {"type": "Announce", "announcement": to_wire(announcement)}
        self._inbox.remember(announcement)
        self._recent.add(announcement)
        targets = self._targets() if peer_ids is None else list(peer_ids)
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
            if peer_id != self._own_id
        }
        if pushes:
            _, slow = await asyncio.wait(pushes, timeout=self.config.announce_wait)
            for task in slow:  # a stalled peer never holds the caller: its push goes on alone
                report.pending.append(pushes[task])
                self._keep(task)
        if report.failed:
            log.debug(
                "announcement not delivered to %d peer(s): %s",
                len(report.failed),
                {short_id(p): r for p, r in report.failed.items()},
            )
        return report

    def forward(self, announcement: Announcement, came_from: bytes) -> None:
        """Gossip: pass a new announcement on to up to `gossip_fanout` random peers (never
        back to whoever sent it or signed it), in the background."""
        skip = {came_from, announcement.sender_id, self._own_id}
        candidates = [peer for peer in self._targets() if peer not in skip]
        fanout = min(self.config.gossip_fanout, len(candidates))
        if fanout <= 0:
            return
        targets = self._rng.sample(candidates, fanout)
        self._keep(asyncio.ensure_future(self.announce(announcement, targets)))

    def _keep(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
