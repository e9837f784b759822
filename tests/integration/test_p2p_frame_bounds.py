"""A member's link frames over real sockets: a frame bomb is refused cheaply and closes its
link, an unknown field closes its link, and one link's frames are read at its frame rate."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import tracemalloc
from collections.abc import AsyncIterator

import pytest
from psyche_client.p2p import P2PConfig, P2PNode
from psyche_client.p2p.connection import PeerConnection, dial_peer
from psyche_client.p2p.stats import TransferStats
from psyche_common.protocol import Identity, encode_payload
from psyche_common.protocol.secure_channel import TAG_SIZE

pytestmark = pytest.mark.timeout(60)

CONFIG = P2PConfig(bind_host="127.0.0.1", connect_timeout=1.0, read_timeout=2.0, gossip_fanout=0)

BOMB_VALUES = (1 << 20) - 64
BOMB = b"\xdd" + BOMB_VALUES.to_bytes(4, "big") + b"\x90" * BOMB_VALUES
"""1 MiB: one array of a million empty arrays (decoded without bounds: 0.7 s of loop time and
64 MiB here)."""


class Members:
    def __init__(self) -> None:
        self.keys: set[bytes] = set()
        self.nodes: list[P2PNode] = []

    async def node(self, **config: object) -> P2PNode:
        identity = Identity.generate()
        self.keys.add(identity.public_key)
        node = P2PNode(
            identity,
            is_member=self.keys.__contains__,
            config=dataclasses.replace(CONFIG, **config),  # type: ignore[arg-type]
        )
        await node.start()
        self.nodes.append(node)
        book = {n.peer_id: n.address for n in self.nodes}
        for each in self.nodes:
            each.set_peers(book)
        return node

    async def dial(self, node: P2PNode) -> PeerConnection:
        """An authenticated link to `node` from a fresh member key, driven by hand."""
        identity = Identity.generate()
        self.keys.add(identity.public_key)
        host, port = node.address.rsplit(":", 1)
        return await dial_peer(
            node.peer_id,
            host,
            int(port),
            identity,
            TransferStats(),
            connect_timeout=2.0,
            handshake_timeout=2.0,
            max_frame_size=CONFIG.max_frame_size,
        )


@pytest.fixture
async def members() -> AsyncIterator[Members]:
    m = Members()
    yield m
    for node in m.nodes:
        await node.close()


async def closed_by_peer(conn: PeerConnection, timeout: float = 5.0) -> bool:
    async with asyncio.timeout(timeout):
        return await conn.reader.read() == b""


async def longest_pause(stop: asyncio.Event) -> float:
    """The longest the event loop went without running this task (ticking every 1 ms)."""
    worst, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    return worst


async def test_a_frame_bomb_is_refused_cheaply_and_closes_its_link(members: Members) -> None:
    node, honest = await members.node(), await members.node()
    attacker = await members.dial(node)
    assert attacker.channel is not None
    frame = attacker.channel.seal_payload(BOMB)
    stop = asyncio.Event()
    pauses = asyncio.ensure_future(longest_pause(stop))
    await asyncio.sleep(0.01)
    tracemalloc.start()
    try:
        attacker.writer.write(frame)
        await attacker.writer.drain()
        assert await closed_by_peer(attacker), "the node must close a link that sent a bomb"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        stop.set()
    worst = await pauses
    # the frame itself passes through a few buffers (socket read, decryption: ~1 MiB each);
    # decoding it without bounds built 64 MiB of lists and held the loop for 0.7 s
    assert peak < 12 * (1 << 20), f"refusing the bomb allocated {peak / (1 << 20):.1f} MiB"
    assert worst < 0.15, f"the event loop stalled for {worst:.3f} s"
    digest = node.publish_blob(b"still serving")
    assert await honest.fetch_blob(digest, [node.peer_id]) == b"still serving"
    await attacker.close()


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "Ping", "sid": 0, "padding": b"x"},  # unknown field
        {"type": "GetBlob", "sid": 1, "hash": [b"a"] * 10},  # wrong kind
        {"type": "Ping", "sid": 0, "nest": {"a": {"b": 1}}},  # too deep
        {"type": "Unknown", "sid": 1, "data": b"x"},  # unknown type with a payload
    ],
)
async def test_a_malformed_link_frame_closes_its_link(
    members: Members, frame: dict[str, object]
) -> None:
    node = await members.node()
    attacker = await members.dial(node)
    assert attacker.channel is not None
    attacker.writer.write(attacker.channel.seal_payload(encode_payload(frame)))
    await attacker.writer.drain()
    assert await closed_by_peer(attacker)
    await attacker.close()


async def test_a_links_frames_are_read_at_its_frame_rate(members: Members) -> None:
    node = await members.node(link_frame_rate=200.0, link_frame_burst=20)
    attacker = await members.dial(node)
    assert attacker.channel is not None
    ping = encode_payload({"type": "Ping", "sid": 0})
    before = node.stats.total_received
    frame_size = 4 + len(ping) + TAG_SIZE
    attacker.writer.write(b"".join(attacker.channel.seal_payload(ping) for _ in range(2000)))
    await attacker.writer.drain()
    await asyncio.sleep(1.0)
    frames = (node.stats.total_received - before) // frame_size
    # a burst of 20, then 200 per second: about 220 frames of the 2000 sent (not all 2000)
    assert 100 <= frames <= 400, frames
    await attacker.close()
