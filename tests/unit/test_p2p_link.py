"""`PeerLink` stream dispatch over a local socket pair (no handshake: links are built on
already-authenticated connections)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from psyche_client.p2p.connection import PeerConnection
from psyche_client.p2p.link import PeerLink, Stream
from psyche_client.p2p.stats import TransferStats

pytestmark = pytest.mark.timeout(20)


async def connection_pair() -> tuple[PeerConnection, PeerConnection]:
    left, right = socket.socketpair()
    pair = []
    for sock, peer in ((left, b"R" * 32), (right, b"L" * 32)):
        reader, writer = await asyncio.open_connection(sock=sock)
        pair.append(PeerConnection(peer, reader, writer, TransferStats(), 1 << 20, 2.0))
    return pair[0], pair[1]


async def test_requests_are_served_whatever_order_their_streams_start() -> None:
    dialer_conn, listener_conn = await connection_pair()
    seen: list[tuple[int, dict[str, Any]]] = []

    def on_request(_link: PeerLink, stream: Stream, request: dict[str, Any]) -> None:
        seen.append((stream.sid, request))

    listener = PeerLink(
        listener_conn, dialed=False, on_request=on_request, idle_timeout=5, max_streams=8
    )
    listener.start()
    # the dialer's streams 5 and 3 reach the writer in that order (concurrent requests race)
    await dialer_conn.send({"type": "GetBlob", "sid": 5})
    await dialer_conn.send({"type": "GetManifest", "sid": 3})
    await dialer_conn.send({"type": "Ack", "sid": 4})  # an answer to a stream it never opened
    await dialer_conn.send({"type": "Ping", "sid": 0})
    async with asyncio.timeout(5):
        while len(seen) < 2:
            await asyncio.sleep(0.01)
    assert seen == [(5, {"type": "GetBlob"}), (3, {"type": "GetManifest"})]
    # a frame without a stream id is a protocol error: the link closes
    await dialer_conn.send({"type": "GetBlob"})
    async with asyncio.timeout(5):
        while listener.usable:
            await asyncio.sleep(0.01)
    await dialer_conn.close()
    await listener.close()


async def test_answers_reach_the_stream_that_asked() -> None:
    dialer_conn, listener_conn = await connection_pair()

    answers: set[asyncio.Future[None]] = set()

    def echo(_link: PeerLink, stream: Stream, request: dict[str, Any]) -> None:
        answers.add(asyncio.ensure_future(stream.send({"type": "Echo", "reason": request["type"]})))

    dialer = PeerLink(dialer_conn, dialed=True, on_request=echo, idle_timeout=5, max_streams=8)
    listener = PeerLink(listener_conn, dialed=False, on_request=echo, idle_timeout=5, max_streams=8)
    dialer.start()
    listener.start()
    one, two = dialer.open_stream(), listener.open_stream()  # both sides ask at once
    assert (one.sid, two.sid) == (1, 2)
    await one.send({"type": "A"})
    await two.send({"type": "B"})
    assert await one.receive(2) == {"type": "Echo", "reason": "A"}
    assert await two.receive(2) == {"type": "Echo", "reason": "B"}
    await dialer.close()
    await listener.close()
