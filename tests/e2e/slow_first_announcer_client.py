"""A test-only slow announcer: a trainer that announces its results like any other but serves
its blobs one byte at a time, a byte every `PAUSE` seconds (under the peers' per-chunk read
timeout, so a fetch neither fails nor finishes until its deadline).

Before, a verifier scored a result only once every result announced before it had settled,
so in every round where this trainer's result came first no check of the round was made in
time. It is `psyche-client` with one change, in its P2P node (`Parts(node=...)`). Each blob
it starts serving is logged as `slow_first_announcer: serving` with the requesting peer. Run
it with `psyche-client`'s arguments:
`python tests/e2e/slow_first_announcer_client.py train --server-addr ...`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.p2p.node import P2PNode
from psyche_common.protocol import short_id

log = logging.getLogger("psyche.client")

PAUSE = 2.0
"""Seconds between two one-byte chunks."""


class SlowServingNode(P2PNode):
    async def _answer(self, conn: Any, kind: str, key: Any, data: bytes | None) -> None:
        if kind != "blob" or data is None:
            await super()._answer(conn, kind, key, data)
            return
        log.info("slow_first_announcer: serving", extra={"peer": short_id(conn.peer_id)})
        await conn.send({"type": "BlobHeader", "size": len(data)})
        for offset in range(len(data)):
            await conn.send({"type": "Chunk", "data": data[offset : offset + 1]})
            await asyncio.sleep(min(PAUSE, self.config.read_timeout / 2))


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(node=SlowServingNode))


if __name__ == "__main__":
    main()
