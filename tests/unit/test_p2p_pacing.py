"""Upload pacing (`psyche_client.p2p.pacing`): the priority writer lock, the bulk-upload
shaper (yielding to urgent answers, the token bucket), and a link writing an urgent frame
ahead of queued parameter chunks."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from psyche_client.p2p.connection import PeerConnection
from psyche_client.p2p.link import PeerLink, Stream
from psyche_client.p2p.pacing import (
    MAX_BULK_CHUNK,
    MIN_BULK_CHUNK,
    PriorityLock,
    UploadShaper,
    limit_unsent,
)
from psyche_client.p2p.stats import TransferStats
from psyche_common.protocol import ConnectionClosed

pytestmark = pytest.mark.timeout(20)


async def test_waiting_urgent_holders_go_before_waiting_bulk_ones() -> None:
    lock = PriorityLock()
    order: list[str] = []

    async def take(name: str, bulk: bool) -> None:
        async with lock.hold(bulk=bulk):
            order.append(name)
            await asyncio.sleep(0)

    await lock.acquire()
    tasks = [
        asyncio.ensure_future(take("bulk1", True)),
        asyncio.ensure_future(take("bulk2", True)),
        asyncio.ensure_future(take("urgent1", False)),
        asyncio.ensure_future(take("urgent2", False)),
    ]
    await asyncio.sleep(0.01)  # every task is waiting now
    lock.release()
    await asyncio.gather(*tasks)
    assert order == ["urgent1", "urgent2", "bulk1", "bulk2"]
    assert not lock.locked


async def test_a_cancelled_waiter_does_not_keep_the_lock() -> None:
    lock = PriorityLock()
    await lock.acquire()
    gone = asyncio.ensure_future(lock.acquire(bulk=True))
    after = asyncio.ensure_future(lock.acquire())
    await asyncio.sleep(0.01)
    lock.release()  # handed to `after` (urgent) first
    gone.cancel()
    await asyncio.sleep(0.01)
    assert after.done() and gone.cancelled()
    lock.release()
    assert not lock.locked
    with pytest.raises(RuntimeError):
        lock.release()


async def test_a_waiter_cancelled_after_being_handed_the_lock_passes_it_on() -> None:
    lock = PriorityLock()
    await lock.acquire()
    first = asyncio.ensure_future(lock.acquire())
    second = asyncio.ensure_future(lock.acquire())
    await asyncio.sleep(0.01)
    lock.release()  # `first` now holds it but has not run yet
    first.cancel()
    async with asyncio.timeout(1):
        await second
    assert lock.locked
    lock.release()
    assert not lock.locked


async def test_the_token_bucket_caps_the_bulk_rate() -> None:
    rate = 1_000_000.0
    shaper = UploadShaper(rate, burst=0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(5):
        await shaper.before_bulk(100_000)
    elapsed = loop.time() - started
    assert elapsed >= 0.45  # 500 kB at 1 MB/s
    assert elapsed < 2.0
    assert shaper.bulk_bytes == 500_000


async def test_no_cap_lets_bulk_through_at_once() -> None:
    shaper = UploadShaper(None)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(50):
        await shaper.before_bulk(1_000_000)
    assert loop.time() - started < 0.2
    assert shaper.bulk_chunk(256 * 1024) == MAX_BULK_CHUNK
    assert shaper.bulk_chunk(1000) == 1000


def test_capped_bulk_chunks_take_a_fraction_of_a_second() -> None:
    assert UploadShaper(200_000.0).bulk_chunk(256 * 1024) == 40_000
    assert UploadShaper(10_000.0).bulk_chunk(256 * 1024) == MIN_BULK_CHUNK
    assert UploadShaper(100e6).bulk_chunk(256 * 1024) == MAX_BULK_CHUNK
    with pytest.raises(ValueError):
        UploadShaper(0.0)


async def test_bulk_waits_while_a_blob_is_being_answered() -> None:
    shaper = UploadShaper(None, max_yield=5.0)
    with shaper.urgent():
        waiting = asyncio.ensure_future(shaper.before_bulk(1000))
        await asyncio.sleep(0.1)
        assert not waiting.done()
    async with asyncio.timeout(1):
        await waiting
    assert shaper.urgent_in_flight == 0


async def test_bulk_yields_at_most_max_yield() -> None:
    shaper = UploadShaper(None, max_yield=0.1)
    loop = asyncio.get_running_loop()
    with shaper.urgent():
        started = loop.time()
        await shaper.before_bulk(1000)
        assert 0.09 <= loop.time() - started < 1.0


async def test_an_urgent_frame_overtakes_queued_parameter_chunks() -> None:
    """Four parameter answers are queued on a link whose peer does not read yet; an
    announcement written then goes right after the chunk being written, before the three
    chunks that were waiting for the writer."""
    left, right = socket.socketpair()
    for sock in (left, right):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader, writer = await asyncio.open_connection(sock=left)
    conn = PeerConnection(b"R" * 32, reader, writer, TransferStats(), 1 << 20, 5.0)
    link = PeerLink(
        conn,
        dialed=True,
        on_request=lambda *_: None,
        idle_timeout=5,
        max_streams=8,
        shaper=UploadShaper(None),
    )
    peer_reader, peer_writer = await asyncio.open_connection(sock=right)
    peer = PeerConnection(b"L" * 32, peer_reader, peer_writer, TransferStats(), 1 << 20, 5.0)

    async def parameter(stream: Stream) -> None:
        stream.bulk = True
        for _ in range(3):
            await stream.send({"type": "Chunk", "data": b"x" * 65536})

    bulk = [asyncio.ensure_future(parameter(link.open_stream())) for _ in range(4)]
    await asyncio.sleep(0.05)  # the socket is full: one chunk drains, the others are queued
    written = conn.stats.total_sent // 65536  # chunks the socket took in already
    urgent = asyncio.ensure_future(link.open_stream().send({"type": "Announce"}))
    await asyncio.sleep(0.05)
    frames: list[dict[str, Any]] = []
    while len(frames) < 13:
        frames.append(await peer.receive(5.0))
    await asyncio.gather(*bulk, urgent)
    kinds = [frame["type"] for frame in frames]
    # next after the chunks already written and the one being written (3 chunks waited)
    assert kinds.index("Announce") <= written + 1, (written, kinds)
    await link.close()
    await peer.close()


async def test_limit_unsent_applies_to_tcp_sockets_only() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    assert limit_unsent(writer) is (getattr(socket, "TCP_NOTSENT_LOWAT", None) is not None)
    writer.close()
    server.close()
    left, right = socket.socketpair()
    _, unix_writer = await asyncio.open_connection(sock=left)
    assert limit_unsent(unix_writer) is False
    unix_writer.close()
    right.close()


async def test_a_frame_waiting_while_its_link_closes_fails_as_closed() -> None:
    left, right = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=left)
    conn = PeerConnection(b"R" * 32, reader, writer, TransferStats(), 1 << 20, 5.0)
    link = PeerLink(conn, dialed=True, on_request=lambda *_: None, idle_timeout=5, max_streams=8)
    await link._write_lock.acquire()  # a frame being written
    waiting = asyncio.ensure_future(link.open_stream().send({"type": "Announce"}))
    await asyncio.sleep(0.01)
    conn.writer.close()  # the link goes down meanwhile
    link._write_lock.release()
    with pytest.raises(ConnectionClosed):
        await waiting
    await link.close()
    right.close()
