"""A test-only early flooder: a member that, after each Finished it announces, pushes
`FLOOD` signed announcements for far-future steps to every other member, as fast as their
acks come back.

It is `psyche-client` with one change, in its network part (`Parts(network=...)`); it trains,
joins and announces its own results normally. Each flood is logged as `early_flood: pushed`
with the peers' answers counted by status (`accepted`, `deferred`, `rejected`, `duplicate`)
and the number of answers that were deferred by the per-peer rate (`rate_deferred`). Run it
with `psyche-client`'s arguments: `python tests/e2e/early_flood_client.py train --server-addr ...`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import NodeNetwork, Parts
from psyche_client.p2p.announcements import (
    FinishedAnnouncement,
    ResultAnnouncement,
    make_finished_announcement,
    to_wire,
)

log = logging.getLogger("psyche.client")

FLOOD = 1200
"""Far-future announcements pushed to each peer per flood (more than a peer's burst)."""
WORKERS = 8
"""Pushes in flight to one peer at once."""
AHEAD = 1000
"""How far ahead of the announced step the flood's steps start."""


class FloodingNetwork(NodeNetwork):
    label = "early_flood"
    """The flood's log line is `<label>: pushed`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.serial = 0
        self.tasks: set[asyncio.Future[Any]] = set()

    async def announce(self, announcement: ResultAnnouncement | FinishedAnnouncement) -> None:
        await super().announce(announcement)
        finished = isinstance(announcement, FinishedAnnouncement) and not announcement.warmup
        if finished and not self.tasks:  # one flood at a time
            task = asyncio.ensure_future(self.flood(announcement.step))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def flood_step(self, step: int) -> int:
        """The step of the flood's next announcement, after our Finished for `step`."""
        return step + AHEAD + self.serial

    async def flood(self, step: int) -> None:
        statuses: Counter[str] = Counter()
        rated = 0
        peers = [p for p in self.node.known_peers() if p != self.node.peer_id]

        async def push(peer: bytes) -> None:
            nonlocal rated
            for _ in range(FLOOD // WORKERS):
                self.serial += 1
                fake = make_finished_announcement(
                    self.node.identity,
                    step=self.flood_step(step),
                    warmup=False,
                    broadcast_merkle=self.serial.to_bytes(32, "big"),
                )
                wire = {"type": "Announce", "announcement": to_wire(fake)}
                try:
                    async with asyncio.timeout(5):
                        async with self.node._pool.connection(peer) as conn:
                            await conn.send(wire)
                            ack = await conn.receive(5)
                except (OSError, TimeoutError, Exception) as exc:  # keep flooding the others
                    statuses[f"error: {type(exc).__name__}"] += 1
                    return
                statuses[str(ack.get("status"))] += 1
                rated += "per second" in str(ack.get("reason", ""))

        await asyncio.gather(*(push(peer) for peer in peers for _ in range(WORKERS)))
        log.info(
            f"{self.label}: pushed",
            extra={
                "step": step,
                "flood_statuses": dict(statuses),
                "rate_deferred": rated,
                "peers": len(peers),
            },
        )


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(network=FloodingNetwork))


if __name__ == "__main__":
    main()
