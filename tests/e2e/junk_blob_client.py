"""A test-only junk-blob server: one signed commitment for each result, but the blob it serves
to chosen victims is junk.

It is `psyche-client` with one change, in its P2P node (`Parts(node=...)`): when one of the
victims (the first half of the other members, by id) asks it for a blob it holds (its own
results and those it fetched), it answers bytes of the right size that are not the blob. The
commitment (data hash) and the blob hash it announced are those of its honest result, and
every other peer gets the real blob. Every junk answer is logged as `junk blob: served junk` (field `victim`). Run it with
`psyche-client`'s arguments: `python tests/e2e/junk_blob_client.py train --server-addr ...`.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.p2p.link import Stream
from psyche_client.p2p.node import P2PNode
from psyche_common.client_id import short_id

log = logging.getLogger("psyche.client")


class JunkBlobNode(P2PNode):
    def victims(self) -> list[bytes]:
        others = sorted(peer for peer in self.known_peers() if peer != self.peer_id)
        return others[: max(1, len(others) // 2)]

    async def _handle(self, conn: Stream, peer_id: bytes, request: dict[str, Any]) -> None:
        digest = request.get("hash")
        data = self.blobs.get(digest) if isinstance(digest, bytes) else None
        if request.get("type") == "GetBlob" and data is not None and peer_id in self.victims():
            junk = bytes((b + 1) % 256 for b in data[:64]) + data[64:]
            log.info("junk blob: served junk", extra={"victim": short_id(peer_id)})
            await self._answer(conn, "blob", digest, junk)
            return
        await super()._handle(conn, peer_id, request)


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(node=JunkBlobNode))


if __name__ == "__main__":
    main()
