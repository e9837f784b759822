"""Small helpers shared by the P2P integration tests: a dead address, a polling wait, and a
`Finished` announcement to push."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from psyche_client.p2p import P2PNode, make_finished_announcement
from psyche_client.p2p.announcements import FinishedAnnouncement


def dead_address() -> str:
    """A loopback `host:port` where nothing listens (connecting is refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


async def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Poll `predicate` every 10 ms until it is true (`TimeoutError` after `timeout` s)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def finished(node: P2PNode, step: int) -> FinishedAnnouncement:
    """A signed `Finished` announcement of `node` for `step`."""
    return make_finished_announcement(
        node.identity, step=step, warmup=False, broadcast_merkle=bytes(32)
    )
