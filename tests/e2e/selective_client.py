"""A test-only client that announces each of its results to one peer only.

It is `psyche-client` with one change: its own result announcements go to a single member
(the first other member by id) instead of all of them; Finished announcements, blobs and
everything else are as usual. Its signatures are valid and it serves its blobs on request, so
only forwarding (gossip) lets the members it did not tell learn of its results. Run it with
`psyche-client`'s arguments: `python tests/e2e/selective_client.py train --server-addr ...`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import NodeNetwork, Parts
from psyche_client.p2p.announcements import (
    FinishedAnnouncement,
    ResultAnnouncement,
)


class SelectiveNetwork(NodeNetwork):
    async def announce(self, announcement: ResultAnnouncement | FinishedAnnouncement) -> None:
        if not isinstance(announcement, ResultAnnouncement):
            await super().announce(announcement)
            return
        others = sorted(peer for peer in self.node.known_peers() if peer != self.node.peer_id)
        if others:
            await self.node.announce(announcement, others[:1])


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(network=SelectiveNetwork))


if __name__ == "__main__":
    main()
