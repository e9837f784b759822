"""A test-only client whose P2P node accepts connections, completes the handshake and then
never answers a request: every announcement pushed to it and every fetch of its blobs waits
until the caller's own timeout.

It is `psyche-client` with that one change; it trains, joins and announces its own results
normally. Run it with `psyche-client`'s arguments:
`python tests/e2e/stalling_client.py train --server-addr ...`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.p2p.node import P2PNode


class StallingNode(P2PNode):
    async def _handle(self, conn: Any, peer_id: bytes, request: dict[str, Any]) -> None:
        await asyncio.sleep(3600)


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(node=StallingNode))


if __name__ == "__main__":
    main()
