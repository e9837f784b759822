"""A test-only frame bomber: a member that, after each Finished it announces, opens a fresh,
authenticated P2P link to every other member and sends one 1 MiB frame holding a million
empty msgpack arrays on it (decoded without bounds: about 0.7 s of the receiver's event loop
and 64 MiB).

It is `psyche-client` with one change, in its network part (`Parts(network=...)`); it trains,
joins and announces its own results normally over its ordinary links. Each round of bombs is
logged as `frame_bomb: sent` with how many links the peers closed after the bomb (`closed`),
how many stayed open (`open`) or could not be dialed (`failed`), and the slowest close in
seconds (`slowest_close_s`). Run it with `psyche-client`'s arguments:
`python tests/e2e/frame_bomb_client.py train --server-addr ...`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import NodeNetwork, Parts
from psyche_client.p2p.announcements import FinishedAnnouncement, ResultAnnouncement
from psyche_client.p2p.connection import dial_peer

log = logging.getLogger("psyche.client")

VALUES = (1 << 20) - 64
BOMB = b"\xdd" + VALUES.to_bytes(4, "big") + b"\x90" * VALUES
"""One array of a million empty arrays: 1 MiB, within the P2P frame size."""


class BombingNetwork(NodeNetwork):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.tasks: set[asyncio.Future[Any]] = set()

    async def announce(self, announcement: ResultAnnouncement | FinishedAnnouncement) -> None:
        await super().announce(announcement)
        finished = isinstance(announcement, FinishedAnnouncement) and not announcement.warmup
        if finished and not self.tasks:  # one round of bombs at a time
            task = asyncio.ensure_future(self.bomb_all(announcement.step))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def bomb_all(self, step: int) -> None:
        outcomes: Counter[str] = Counter()
        closes: list[float] = []

        async def bomb(peer: bytes, host: str, port: int) -> None:
            node = self.node
            try:
                conn = await dial_peer(
                    peer,
                    host,
                    port,
                    node.identity,
                    node.stats,
                    connect_timeout=5.0,
                    handshake_timeout=5.0,
                    max_frame_size=node.config.max_frame_size,
                )
                assert conn.channel is not None
                started = time.monotonic()
                conn.writer.write(conn.channel.seal_payload(BOMB))
                await conn.writer.drain()
                async with asyncio.timeout(10):
                    await conn.reader.read()  # returns at the end of the stream (whatever the
                    # peer had queued for us on this link before it closed it)
                closes.append(time.monotonic() - started)
                outcomes["closed"] += 1
                await conn.close()
            except TimeoutError:
                outcomes["open"] += 1
            except Exception as exc:  # keep bombing the others
                outcomes[f"failed: {type(exc).__name__}"] += 1

        peers = [
            (peer, *address)
            for peer, address in self.node._peers.items()
            if peer != self.node.peer_id
        ]
        await asyncio.gather(*(bomb(*target) for target in peers))
        log.info(
            "frame_bomb: sent",
            extra={
                "step": step,
                "closed": outcomes["closed"],
                "open": outcomes["open"],
                "failed": sum(n for k, n in outcomes.items() if k.startswith("failed")),
                "slowest_close_s": round(max(closes, default=0.0), 3),
            },
        )


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(network=BombingNetwork))


if __name__ == "__main__":
    main()
