"""A test-only slow reader: a member that keeps every other member's serving slots busy by
requesting old blobs on many streams and reading the answers at a trickle.

It is `psyche-client` with one change, in its network part (`Parts(network=...)`); it trains,
joins and announces its own results normally. From its `START_STEP`th step on, it keeps, for
each other member, one extra P2P connection (its own key, a tiny receive buffer) on which it
opens `STREAMS` requests for blobs of earlier steps (every blob it holds: its peers hold them
too) and reads them at about 1 MB/s (`READ_BYTES` per `TICK`). When the peer gives up on it (its writes time out and
it closes the connection) it opens another. Each connection is logged as `slow_reader:
holding requests`. Run it with `psyche-client`'s arguments:
`python tests/e2e/slow_reader_client.py train --server-addr ...`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import NodeNetwork, Parts
from psyche_client.p2p.connection import dial_over
from psyche_common.protocol import short_id

log = logging.getLogger("psyche.client")

START_STEP = 2
STREAMS = 64
"""Requests opened per connection (a link accepts 2 x max_concurrent_serving)."""
READ_BYTES = 64 * 1024
"""Bytes read per `TICK` per connection (at most: what the small buffers hold), about 1 MB/s:
fast enough that a peer's writes to it never time out (every frame passes within the write
timeout), slow enough that 64 requests of 1 MiB keep 32 serving slots busy for a minute."""
TICK = 0.05
BUFFER = 64 * 1024


class SlowReadingNetwork(NodeNetwork):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.readers: dict[bytes, asyncio.Future[Any]] = {}
        self.step = 0

    def begin_step(self, step: int) -> None:
        super().begin_step(step)
        self.step = step
        if step < START_STEP:
            return
        for peer in self.node.known_peers():
            task = self.readers.get(peer)
            if peer != self.node.peer_id and (task is None or task.done()):
                self.readers[peer] = asyncio.ensure_future(self.hold(peer))

    async def hold(self, peer: bytes) -> None:
        """Hold `peer`'s serving slots until this process ends, one connection at a time."""
        while True:
            try:
                await self.hold_once(peer)
            except Exception as exc:  # the peer closed us: open another
                log.debug("slow_reader: %s closed: %s", short_id(peer), exc)
            await asyncio.sleep(0.2)

    async def hold_once(self, peer: bytes) -> None:
        address = self.node._peers.get(peer)
        blobs = list(self.node.blobs.hashes())
        if address is None or not blobs:
            await asyncio.sleep(1.0)
            return
        host, port = address
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=BUFFER)
        config = self.node.config
        try:
            conn = await dial_over(
                peer,
                reader,
                writer,
                self.node.identity,
                self.node.stats,
                where=f"{short_id(peer)} (slow reader)",
                handshake_timeout=config.read_timeout,
                max_frame_size=config.max_frame_size,
            )
            for i in range(STREAMS):
                await conn.send(
                    {"type": "GetBlob", "hash": blobs[i % len(blobs)], "sid": 2 * i + 1}
                )
            log.info(
                "slow_reader: holding requests",
                extra={
                    "step": self.step,
                    "peer": short_id(peer),
                    "requests": STREAMS,
                    "blobs": len(blobs),
                },
            )
            while True:
                await asyncio.sleep(TICK)
                if not await reader.read(READ_BYTES):
                    return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(network=SlowReadingNetwork))


if __name__ == "__main__":
    main()
