"""Real P2P nodes on 127.0.0.1: announcements, blob fetch, failures, limits and counters."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psyche_client.p2p import (
    Announcement,
    FetchError,
    P2PConfig,
    P2PNode,
    blob_hash,
    make_finished_announcement,
    make_result_announcement,
)
from psyche_client.p2p.pushing import AnnounceReport
from psyche_common.announcements import from_wire, to_wire
from psyche_common.protocol import ConnectionClosed, Identity, read_frame, write_frame

from bench.harness.tamper_proxy import DOWN, Flip, TamperProxy
from bench.support.ports import free_port

pytestmark = pytest.mark.timeout(60)

FAST = P2PConfig(
    bind_host="127.0.0.1",
    connect_timeout=1.0,
    read_timeout=0.5,
    fetch_deadline=10.0,
    retry_backoff=0.01,
    manifest_timeout=2.0,
    announce_timeout=2.0,
    gossip_fanout=0,  # direct pushes only, unless a test turns gossip on
)


class CorruptNode(P2PNode):
    """Serves every blob with its first byte flipped."""

    def _outgoing_bytes(self, kind: str, key: Any, data: bytes) -> bytes:
        return bytes([data[0] ^ 0xFF]) + data[1:] if data else data


class SlowNode(P2PNode):
    """Counts concurrent requests it is handling and holds each one a little while."""

    active = 0
    peak = 0

    async def _handle(self, conn: Any, peer_id: bytes, request: dict[str, Any]) -> None:
        type(self).active += 1
        type(self).peak = max(type(self).peak, type(self).active)
        try:
            await asyncio.sleep(0.1)
            await super()._handle(conn, peer_id, request)
        finally:
            type(self).active -= 1


class TricklingNode(P2PNode):
    """Serves every blob a byte at a time, each byte well within the reader's `read_timeout`:
    a transfer that never stalls long enough to time out, and never finishes."""

    async def _answer(self, conn: Any, kind: str, key: Any, data: bytes | None) -> None:
        if kind != "blob" or data is None:
            await super()._answer(conn, kind, key, data)
            return
        await conn.send({"type": "BlobHeader", "size": len(data)})
        for offset in range(len(data)):
            await conn.send({"type": "Chunk", "data": data[offset : offset + 1]})
            await asyncio.sleep(0.1)


class Cluster:
    def __init__(self) -> None:
        self.members: set[bytes] = set()
        self.nodes: list[P2PNode] = []
        self.received: dict[bytes, list[tuple[Announcement, bytes]]] = {}
        self.corrupt_reports: dict[bytes, list[tuple[bytes, bytes]]] = {}

    async def add(
        self, cls: type[P2PNode] = P2PNode, *, member: bool = True, **config: Any
    ) -> P2PNode:
        identity = Identity.generate()
        if member:
            self.members.add(identity.public_key)
        inbox = self.received.setdefault(identity.public_key, [])
        reports = self.corrupt_reports.setdefault(identity.public_key, [])
        node = cls(
            identity,
            is_member=self.members.__contains__,
            config=dataclasses.replace(FAST, **config),
            on_announcement=lambda v, via: inbox.append((v.announcement, via)),
            on_corrupt=lambda peer, h: reports.append((peer, h)),
        )
        await node.start()
        self.nodes.append(node)
        self.wire()
        return node

    def wire(self, extra: dict[bytes, str] | None = None) -> None:
        book = {n.peer_id: n.address for n in self.nodes} | (extra or {})
        for node in self.nodes:
            node.set_peers(book)

    async def close(self) -> None:
        for node in self.nodes:
            await node.close()


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    yield c
    await c.close()


async def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def announce_blob(node: P2PNode, data: bytes, step: int = 3) -> Any:
    digest = node.publish_blob(data, step=step)
    return make_result_announcement(
        node.identity,
        run_id="test",
        round_seed=0,
        step=step,
        batch_start=10,
        batch_end=13,
        data_hash=blob_hash(b"commitment" + data),
        blob_hash=digest,
        size=len(data),
    )


async def test_announce_and_fetch_among_three_nodes(cluster: Cluster) -> None:
    a, b, c = [await cluster.add() for _ in range(3)]
    payload = os.urandom(300_000)
    announcement = announce_blob(a, payload)
    report = await a.announce(announcement)
    assert sorted(report.delivered) == sorted([b.peer_id, c.peer_id]) and not report.failed
    for node in (b, c):
        [(got, via)] = cluster.received[node.peer_id]
        assert got == announcement and via == a.peer_id
        data = await node.fetch_blob(
            got.blob_hash, [got.sender_id], expected_size=got.size, step=got.step
        )
        assert data == payload
        assert got.blob_hash in node.blobs
    assert cluster.received[a.peer_id] == []  # our own announcement is not echoed back


async def test_gossip_carries_an_announcement_pushed_to_one_member_to_all(
    cluster: Cluster,
) -> None:
    nodes = [await cluster.add(gossip_fanout=2) for _ in range(5)]
    sender, first = nodes[0], nodes[1]
    announcement = announce_blob(sender, b"only told to one peer")
    report = await sender.announce(announcement, [first.peer_id])  # a selective announcer
    assert report.delivered == [first.peer_id]
    others = [node.peer_id for node in nodes[1:]]
    await wait_until(lambda: all(cluster.received[peer] for peer in others))
    for peer in others:  # each member got it exactly once, via someone
        [(got, _via)] = cluster.received[peer]
        assert got == announcement
    assert cluster.received[sender.peer_id] == []  # never echoed back to its signer


async def test_without_gossip_an_announcement_stays_where_it_was_pushed(
    cluster: Cluster,
) -> None:
    a, b, c = [await cluster.add() for _ in range(3)]
    await a.announce(announce_blob(a, b"x"), [b.peer_id])
    await asyncio.sleep(0.3)
    assert len(cluster.received[b.peer_id]) == 1 and cluster.received[c.peer_id] == []


async def test_duplicate_announcement_is_delivered_once(cluster: Cluster) -> None:
    a, b = await cluster.add(), await cluster.add()
    finished = make_finished_announcement(
        a.identity, step=4, warmup=False, broadcast_merkle=b"\1" * 32
    )
    await a.announce(finished)
    await a.announce(finished)  # a rebroadcast
    assert [x for x, _ in cluster.received[b.peer_id]] == [finished]


async def test_bad_signature_announcement_is_rejected(cluster: Cluster) -> None:
    a, b = await cluster.add(), await cluster.add()
    good = announce_blob(a, b"payload")
    forged = from_wire(to_wire(good) | {"batch_start": 11})  # field changed after signing
    report = await a.announce(forged)
    assert report.delivered == []
    assert "signature does not verify" in report.failed[b.peer_id]
    stranger = Identity.generate()  # commitment signed by someone else
    forged2 = from_wire(to_wire(good) | {"commitment_signature": stranger.sign(good.data_hash)})
    report = await a.announce(forged2)
    assert "commitment_signature does not verify" in report.failed[b.peer_id]
    assert cluster.received[b.peer_id] == []


async def test_announcement_signed_by_non_member_is_rejected(cluster: Cluster) -> None:
    a, b = await cluster.add(), await cluster.add()
    outsider = Identity.generate()
    announcement = make_finished_announcement(
        outsider, step=1, warmup=True, broadcast_merkle=bytes(32)
    )
    report = await a.announce(announcement)  # relayed by a member, signed by a non-member
    assert "is not a member" in report.failed[b.peer_id]
    assert cluster.received[b.peer_id] == []


async def test_fetch_from_a_non_announcer_holder(cluster: Cluster) -> None:
    a, b, c = [await cluster.add() for _ in range(3)]
    payload = os.urandom(100_000)
    announcement = announce_blob(a, payload)
    await b.fetch_blob(announcement.blob_hash, [a.peer_id])
    await a.close()  # the announcer is gone; b re-serves what it verified
    data = await c.fetch_blob(announcement.blob_hash, [a.peer_id, b.peer_id])
    assert data == payload
    assert b.stats.peers[c.peer_id].bytes_sent > len(payload)


async def test_corrupted_blob_is_detected_and_fetched_elsewhere(cluster: Cluster) -> None:
    bad = await cluster.add(CorruptNode)
    good = await cluster.add()
    fetcher = await cluster.add()
    payload = os.urandom(50_000)
    digest = bad.publish_blob(payload)
    good.publish_blob(payload)
    data = await fetcher.fetch_blob(digest, [bad.peer_id, good.peer_id])
    assert data == payload
    assert cluster.corrupt_reports[fetcher.peer_id] == [(bad.peer_id, digest)]
    assert fetcher.stats.downloads.corrupt == 1


async def test_only_corrupt_holders_raise_fetch_error_naming_them(cluster: Cluster) -> None:
    bad = await cluster.add(CorruptNode)
    fetcher = await cluster.add()
    digest = bad.publish_blob(b"x" * 1000)
    with pytest.raises(FetchError) as info:
        await fetcher.fetch_blob(digest, [bad.peer_id])
    assert info.value.corrupt_peers == [bad.peer_id]
    assert digest not in fetcher.blobs


class SilentServer:
    """Accepts TCP connections and never writes a byte (a hung peer)."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()


async def start_silent_server() -> SilentServer:
    silent = SilentServer()
    silent.server = await asyncio.start_server(silent._accept, "127.0.0.1", 0)
    return silent


async def test_silent_peer_times_out_and_another_peer_serves(cluster: Cluster) -> None:
    silent = await start_silent_server()
    try:
        silent_id = Identity.generate().public_key
        cluster.members.add(silent_id)
        good, fetcher = await cluster.add(), await cluster.add()
        cluster.wire({silent_id: f"127.0.0.1:{silent.port}"})
        digest = good.publish_blob(b"hello" * 1000)
        started = time.monotonic()
        assert await fetcher.fetch_blob(digest, [silent_id, good.peer_id]) == b"hello" * 1000
        assert 0.4 < time.monotonic() - started < 3.0
        started = time.monotonic()
        with pytest.raises(FetchError, match="timed out"):
            await fetcher.fetch_blob(blob_hash(b"other"), [silent_id])
        assert time.monotonic() - started < 3.0  # 2 rounds x 0.5 s read timeout
    finally:
        await silent.stop()


async def test_a_trickling_holder_is_abandoned_for_the_next_by_the_minimum_rate(
    cluster: Cluster,
) -> None:
    """A peer that serves a blob a byte every 0.1 s never trips the 0.5 s read timeout; the
    minimum blob rate (here 1 KiB/s: the 2 KiB blob is due within 0.5 + 2 s) abandons it, so
    the download slot is held seconds, not until the fetch deadline, and the honest holder
    serves the bytes."""
    trickler = await cluster.add(TricklingNode)
    good = await cluster.add()
    fetcher = await cluster.add(min_blob_rate=1024.0, fetch_deadline=30.0)
    data = os.urandom(2048)
    digest = trickler.publish_blob(data)
    assert good.publish_blob(data) == digest
    started = time.monotonic()
    assert await fetcher.fetch_blob(digest, [trickler.peer_id, good.peer_id]) == data
    assert 2.0 < time.monotonic() - started < 6.0
    started = time.monotonic()
    with pytest.raises(FetchError, match="slower than the minimum of 1024 B/s"):
        await fetcher.fetch_blob(trickler.publish_blob(os.urandom(2048)), [trickler.peer_id])
    assert time.monotonic() - started < 8.0  # 2 rounds x 2.5 s, far below the 30 s deadline


async def test_a_slow_announcer_holds_only_its_share_of_the_download_slots(
    cluster: Cluster,
) -> None:
    """Downloads are charged to their announcer (the first candidate) before a shared slot:
    three blobs of a trickling announcer hold 2 of the 3 slots (the third waits, holding
    none), and another member's result is fetched at once instead of behind them."""
    trickler = await cluster.add(TricklingNode)
    good = await cluster.add()
    fetcher = await cluster.add(
        max_concurrent_downloads=3,
        max_downloads_per_source=2,
        min_blob_rate=8.0,  # the trickled 2 KiB would be due in minutes
        fetch_deadline=30.0,
    )
    slow = [
        asyncio.ensure_future(
            fetcher.fetch_blob(trickler.publish_blob(os.urandom(2048)), [trickler.peer_id])
        )
        for _ in range(3)
    ]
    try:
        await wait_until(lambda: fetcher.stats.downloads.started == 2)
        await asyncio.sleep(0.3)
        assert fetcher.stats.downloads.started == 2  # the announcer's third waits
        started = time.monotonic()
        data = os.urandom(4096)
        assert await fetcher.fetch_blob(good.publish_blob(data), [good.peer_id]) == data
        assert time.monotonic() - started < 1.0
    finally:
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)


async def test_overall_deadline_bounds_a_fetch(cluster: Cluster) -> None:
    silent = await start_silent_server()
    try:
        silent_id = Identity.generate().public_key
        cluster.members.add(silent_id)
        fetcher = await cluster.add(read_timeout=5.0, fetch_deadline=0.3)
        cluster.wire({silent_id: f"127.0.0.1:{silent.port}"})
        started = time.monotonic()
        with pytest.raises(FetchError, match="overall deadline"):
            await fetcher.fetch_blob(blob_hash(b"x"), [silent_id])
        assert time.monotonic() - started < 1.5
    finally:
        await silent.stop()


async def test_dead_address_fails_quickly(cluster: Cluster) -> None:
    dead_id = Identity.generate().public_key
    cluster.members.add(dead_id)
    good, fetcher = await cluster.add(), await cluster.add()
    cluster.wire({dead_id: f"127.0.0.1:{free_port()}"})
    digest = good.publish_blob(b"data")
    started = time.monotonic()
    assert await fetcher.fetch_blob(digest, [dead_id, good.peer_id]) == b"data"
    assert time.monotonic() - started < 0.9  # refused at once, not a 1 s connect timeout
    with pytest.raises(FetchError, match="cannot connect"):
        await fetcher.fetch_blob(blob_hash(b"nope"), [dead_id])
    unknown = Identity.generate().public_key
    with pytest.raises(FetchError, match="no P2P address known"):
        await fetcher.fetch_blob(blob_hash(b"nope"), [unknown])


async def test_non_member_is_refused(cluster: Cluster) -> None:
    member = await cluster.add()
    outsider = await cluster.add(member=False)
    digest = member.publish_blob(b"secret")
    with pytest.raises(FetchError, match="not a member of the current epoch"):
        await outsider.fetch_blob(digest, [member.peer_id])
    report = await outsider.announce(
        make_finished_announcement(
            outsider.identity, step=1, warmup=True, broadcast_merkle=bytes(32)
        )
    )
    assert "not a member of the current epoch" in report.failed[member.peer_id]
    # membership changes are honoured on existing pooled connections too
    cluster.members.add(outsider.peer_id)
    assert await outsider.fetch_blob(digest, [member.peer_id]) == b"secret"
    cluster.members.discard(outsider.peer_id)
    with pytest.raises(FetchError, match="no longer a member"):
        await outsider.fetch_blob(member.publish_blob(b"more"), [member.peer_id])


async def test_dialer_checks_the_listener_identity(cluster: Cluster) -> None:
    a, b = await cluster.add(), await cluster.add()
    impostor_id = Identity.generate().public_key
    cluster.members.add(impostor_id)
    cluster.wire({impostor_id: a.address})  # an address that belongs to someone else
    with pytest.raises(FetchError, match=f"is {a.peer_id[:4].hex()}, not"):
        await b.fetch_blob(a.publish_blob(b"z"), [impostor_id])


async def test_dialer_signs_nothing_before_the_listener_proves_its_key(cluster: Cluster) -> None:
    """A listener that cannot prove the key the dialer meant to reach gets no signature."""
    dialer = await cluster.add()
    claimed = Identity.generate()
    cluster.members.add(claimed.public_key)
    received: list[object] = []

    async def bogus_listener(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        challenge = {"type": "Challenge", "challenge": os.urandom(32), "ephemeral": os.urandom(32)}
        await write_frame(writer, challenge)
        received.append(await read_frame(reader, timeout=5))  # the dialer's Hello
        wrong = Identity.generate().sign(b"not the transcript")
        await write_frame(
            writer, {"type": "Proof", "public_key": claimed.public_key, "signature": wrong}
        )
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            while True:
                received.append(await read_frame(reader, timeout=5))
        writer.close()

    listener = await asyncio.start_server(bogus_listener, "127.0.0.1", 0)
    async with listener:
        port = listener.sockets[0].getsockname()[1]
        cluster.wire({claimed.public_key: f"127.0.0.1:{port}"})
        with pytest.raises(FetchError, match=r"Proof of .* does not verify"):
            await dialer.fetch_blob(b"h" * 32, [claimed.public_key])
        await wait_until(lambda: len(received) >= 1)
        await asyncio.sleep(0.1)
    # one Hello per attempt (the fetch retries), never a Proof
    assert {frame["type"] for frame in received} == {"Hello"}  # type: ignore[index]


async def test_large_blob_is_streamed_in_chunks(cluster: Cluster) -> None:
    server = await cluster.add(chunk_size=256 * 1024)
    fetcher = await cluster.add()
    payload = os.urandom(20 * 1024 * 1024)
    digest = server.publish_blob(payload)
    fetcher.stats.set_step(7)
    assert await fetcher.fetch_blob(digest, [server.peer_id], expected_size=len(payload)) == payload
    received = fetcher.stats.for_step(7).bytes_received
    chunks = len(payload) // (256 * 1024)
    assert len(payload) < received < len(payload) + chunks * 64 + 4096
    assert fetcher.config.max_frame_size < len(payload)  # one frame could not have carried it


async def test_wrong_size_is_refused_before_download(cluster: Cluster) -> None:
    server, fetcher = await cluster.add(), await cluster.add()
    digest = server.publish_blob(b"a" * 5000)
    with pytest.raises(FetchError, match="expected 10"):
        await fetcher.fetch_blob(digest, [server.peer_id], expected_size=10)


async def test_concurrent_downloads_are_bounded(cluster: Cluster) -> None:
    SlowNode.active = SlowNode.peak = 0
    server = await cluster.add(SlowNode)
    fetcher = await cluster.add(max_concurrent_downloads=2)
    digests = [server.publish_blob(os.urandom(1000)) for _ in range(6)]
    results = await asyncio.gather(*(fetcher.fetch_blob(d, [server.peer_id]) for d in digests))
    assert [blob_hash(r) for r in results] == digests
    assert SlowNode.peak == 2


async def test_same_blob_requested_twice_downloads_once(cluster: Cluster) -> None:
    server, fetcher = await cluster.add(), await cluster.add()
    digest = server.publish_blob(os.urandom(10_000))
    await asyncio.gather(*(fetcher.fetch_blob(digest, [server.peer_id]) for _ in range(3)))
    assert fetcher.stats.downloads.started == 1 and fetcher.stats.downloads.finished == 1


async def test_byte_counters_per_step(cluster: Cluster) -> None:
    server, fetcher = await cluster.add(), await cluster.add()
    first, second = os.urandom(10_000), os.urandom(30_000)
    fetcher.stats.set_step(1)
    server.stats.set_step(1)
    await fetcher.fetch_blob(server.publish_blob(first), [server.peer_id])
    fetcher.stats.set_step(2)
    server.stats.set_step(2)
    await fetcher.fetch_blob(server.publish_blob(second), [server.peer_id])
    step1, step2 = fetcher.stats.for_step(1), fetcher.stats.for_step(2)
    assert len(first) < step1.bytes_received < len(first) + 1000  # handshake + framing
    assert len(second) < step2.bytes_received < len(second) + 200  # pooled: no new handshake
    assert step1.bytes_sent > 0 and step2.bytes_sent < 200
    assert server.stats.for_step(2).bytes_sent == step2.bytes_received
    assert server.stats.for_step(1).bytes_received == step1.bytes_sent
    assert fetcher.stats.total_received == step1.bytes_received + step2.bytes_received


async def test_announce_report_covers_unreachable_peers(cluster: Cluster) -> None:
    a, b = await cluster.add(), await cluster.add()
    dead_id = Identity.generate().public_key
    cluster.members.add(dead_id)
    cluster.wire({dead_id: f"127.0.0.1:{free_port()}"})
    report = await a.announce(announce_blob(a, b"p"))
    assert isinstance(report, AnnounceReport)
    assert report.delivered == [b.peer_id] and list(report.failed) == [dead_id]


async def test_prune_forgets_old_blobs(cluster: Cluster) -> None:
    server, fetcher = await cluster.add(), await cluster.add()
    digest = server.publish_blob(b"old", step=1)
    server.forget_before(2)
    with pytest.raises(FetchError, match="does not hold"):
        await fetcher.fetch_blob(digest, [server.peer_id])


async def test_set_step_tags_fetched_blobs_and_counts_traffic(cluster: Cluster) -> None:
    server, fetcher = await cluster.add(), await cluster.add()
    fetcher.set_step(5)
    digest = server.publish_blob(b"r" * 100, step=5)
    await fetcher.fetch_blob(digest, [server.peer_id])
    assert fetcher.stats.for_step(5).bytes_received > 100
    fetcher.forget_before(5)
    assert digest in fetcher.blobs
    fetcher.forget_before(6)
    assert digest not in fetcher.blobs


async def test_a_failing_app_callback_does_not_break_the_node(cluster: Cluster) -> None:
    def broken(*_args: Any) -> None:
        raise RuntimeError("app bug")

    server = await cluster.add()
    server._requests._get_manifest = broken
    server._requests._get_parameter_bytes = broken
    server._inbox.callback = broken
    client = await cluster.add()
    from psyche_client.p2p.model_share import request_manifest
    from psyche_client.p2p.transfer import NotHeld

    with pytest.raises(NotHeld, match="no such parameter"):
        await client.request_stream(
            server.peer_id, {"type": "GetParameter", "name": "w"}, max_size=100
        )
    with pytest.raises(NotHeld, match="no such manifest"):
        await request_manifest(client, server.peer_id)
    announcement = make_finished_announcement(
        client.identity, step=1, warmup=True, broadcast_merkle=bytes(32)
    )
    assert (await client.announce(announcement)).delivered == [server.peer_id]
    digest = server.publish_blob(b"still serving")
    assert await client.fetch_blob(digest, [server.peer_id]) == b"still serving"


async def test_garbage_and_unknown_requests_only_close_that_connection(cluster: Cluster) -> None:
    from psyche_client.p2p.transfer import RemoteError

    server, client = await cluster.add(), await cluster.add()
    host, port = server.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    await reader.readexactly(4)  # the Challenge's length prefix; then send an absurd frame
    writer.write(b"\xff\xff\xff\xff")
    await writer.drain()
    async with asyncio.timeout(2):
        await reader.read()  # the server closes the stream
    writer.close()
    with pytest.raises(RemoteError, match="unknown request type 'Bogus'"):
        await client.request_stream(server.peer_id, {"type": "Bogus"}, max_size=10)
    digest = server.publish_blob(b"fine")
    assert await client.fetch_blob(digest, [server.peer_id]) == b"fine"


class LyingSizeNode(P2PNode):
    """Announces absurd sizes: over any limit for blobs, 100 MB then silence otherwise."""

    async def _answer(self, conn: Any, kind: str, key: Any, data: bytes | None) -> None:
        size = 2**40 if kind == "blob" else 100 * 1024 * 1024
        await conn.send({"type": "BlobHeader", "size": size})


async def test_oversized_or_stalled_transfers_fail_cleanly(cluster: Cluster) -> None:
    liar, fetcher = await cluster.add(LyingSizeNode), await cluster.add()
    with pytest.raises(FetchError, match="over the limit"):
        await fetcher.fetch_blob(liar.publish_blob(b"x"), [liar.peer_id])
    from psyche_client.p2p.transfer import receive_bytes

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with fetcher._pool.connection(liar.peer_id) as conn:
            await conn.send({"type": "GetParameter", "name": "w"})
            await receive_bytes(conn, max_size=2**30, read_timeout=0.3)
    assert time.monotonic() - started < 2


async def test_fetched_blob_takes_the_step_of_its_announcement(cluster: Cluster) -> None:
    a, b = await cluster.add(), await cluster.add()
    announcement = announce_blob(a, b"result bytes", step=9)
    await a.announce(announcement)
    await b.fetch_blob(announcement.blob_hash, [a.peer_id])  # no step given
    b.forget_before(9)
    assert announcement.blob_hash in b.blobs
    b.forget_before(10)
    assert announcement.blob_hash not in b.blobs
    a.forget_before(10)  # the announcer's own published blob too
    assert announcement.blob_hash not in a.blobs


async def test_inbound_connections_are_capped(cluster: Cluster) -> None:
    node = await cluster.add(max_inbound_connections=2)
    other = await cluster.add()
    idle = [await asyncio.open_connection("127.0.0.1", node.port) for _ in range(2)]
    await wait_until(lambda: len(node.inbound.conns) == 2)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.port)
    with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
        await asyncio.wait_for(reader.readexactly(4), 5)  # closed before any Challenge
    assert node.refused_inbound == 1
    for _, w in idle:
        w.close()
    await wait_until(lambda: not node.inbound.conns)
    assert await other.fetch_blob(node.publish_blob(b"x" * 10), [node.peer_id]) == b"x" * 10
    writer.close()


async def test_serving_concurrency_is_capped(cluster: Cluster) -> None:
    release = asyncio.Event()
    running: list[str] = []

    def parameter(name: str) -> bytes:
        running.append(name)
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)
        return b"p" * 100

    loop = asyncio.get_running_loop()
    server = P2PNode(
        Identity.generate(),
        is_member=lambda _peer: True,
        config=dataclasses.replace(FAST, max_concurrent_serving=2),
        get_parameter_bytes=parameter,
    )
    await server.start()
    try:
        clients = [await cluster.add() for _ in range(4)]
        for client in clients:
            client.set_peers({server.peer_id: server.address})
        requests = [
            asyncio.ensure_future(
                client.request_stream(
                    server.peer_id, {"type": "GetParameter", "name": f"w{i}"}, max_size=1000
                )
            )
            for i, client in enumerate(clients)
        ]
        await wait_until(lambda: len(running) == 2)
        await asyncio.sleep(0.2)
        assert len(running) == 2, "only two requests may be served at once"
        release.set()
        results = await asyncio.gather(*requests)
        assert [r.data for r in results] == [b"p" * 100] * 4
    finally:
        release.set()
        await server.close()


async def test_oversized_result_announcement_is_refused(cluster: Cluster) -> None:
    sender, receiver = await cluster.add(), await cluster.add(max_result_size=1000)
    announcement = make_result_announcement(
        sender.identity,
        run_id="test",
        round_seed=0,
        step=3,
        batch_start=0,
        batch_end=1,
        data_hash=blob_hash(b"c"),
        blob_hash=blob_hash(b"b"),
        size=1001,
    )
    report = await sender.announce(announcement, [receiver.peer_id])
    assert "1001 bytes (max_result_size 1000)" in report.failed[receiver.peer_id]
    assert cluster.received[receiver.peer_id] == []


def conflicting(sender: P2PNode, data: bytes, blob: bytes) -> Any:
    """A result of `sender` for batch 0..1 of step 3: commitment `data`, blob `blob`."""
    return make_result_announcement(
        sender.identity,
        run_id="test",
        round_seed=0,
        step=3,
        batch_start=0,
        batch_end=1,
        data_hash=blob_hash(data),
        blob_hash=blob_hash(blob),
        size=10,
    )


async def test_a_second_commitment_for_a_batch_is_kept_a_third_refused(cluster: Cluster) -> None:
    sender, receiver = await cluster.add(), await cluster.add()
    first = await sender.announce(conflicting(sender, b"one", b"b1"), [receiver.peer_id])
    assert first.delivered == [receiver.peer_id]
    # the same data hash with another blob is another commitment: kept, it proves the
    # equivocation (before, it was accepted as "the same" and downloads keyed by the data
    # hash never tried the good blob)
    second = await sender.announce(conflicting(sender, b"one", b"b2"), [receiver.peer_id])
    assert second.delivered == [receiver.peer_id]
    third = await sender.announce(conflicting(sender, b"two", b"b3"), [receiver.peer_id])
    assert "already proven" in third.failed[receiver.peer_id]
    assert len(cluster.received[receiver.peer_id]) == 2


async def test_two_commitments_pushed_to_two_halves_reach_everyone(cluster: Cluster) -> None:
    """Finding 2: a second commitment was refused without being forwarded, so the halves an
    equivocator told different things kept different candidates. Now both reach all."""
    sender = await cluster.add(gossip_fanout=4)
    honest = [await cluster.add(gossip_fanout=4) for _ in range(4)]
    a = conflicting(sender, b"A", b"blob-a")
    b = conflicting(sender, b"B", b"blob-b")
    await sender.announce(a, [n.peer_id for n in honest[:2]])
    await sender.announce(b, [n.peer_id for n in honest[2:]])
    for node in honest:
        await wait_until(lambda node=node: len(cluster.received[node.peer_id]) == 2)
        assert {got.data_hash for got, _ in cluster.received[node.peer_id]} == {
            a.data_hash,
            b.data_hash,
        }


async def test_a_stalled_peer_does_not_hold_the_announcer(cluster: Cluster) -> None:
    silent = await start_silent_server()
    try:
        silent_id = Identity.generate().public_key
        cluster.members.add(silent_id)
        sender = await cluster.add(announce_wait=0.3, announce_timeout=3.0)
        good = await cluster.add()
        cluster.wire({silent_id: f"127.0.0.1:{silent.port}"})
        started = time.monotonic()
        report = await sender.announce(announce_blob(sender, b"data"))
        assert time.monotonic() - started < 1.5
        assert report.delivered == [good.peer_id]
        assert report.pending == [silent_id]
        # the push to the stalled peer goes on in the background and ends by its own bound
        await wait_until(lambda: silent_id in report.failed, timeout=10)
    finally:
        await silent.stop()


async def test_inbound_connections_from_one_address_are_capped(cluster: Cluster) -> None:
    """Idle sockets from one host take at most `max_inbound_per_ip` slots: honest peers on
    other addresses are still served while they are open."""
    node = await cluster.add(max_inbound_per_ip=2)
    other = await cluster.add()
    flood = [
        await asyncio.open_connection("127.0.0.1", node.port, local_addr=("127.0.0.2", 0))
        for _ in range(2)
    ]
    await wait_until(lambda: len(node.inbound.conns) == 2)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", node.port, local_addr=("127.0.0.2", 0)
    )
    with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
        await asyncio.wait_for(reader.readexactly(4), 5)  # closed before any Challenge
    assert node.refused_inbound == 1
    blob = node.publish_blob(b"y" * 10)
    assert await other.fetch_blob(blob, [node.peer_id]) == b"y" * 10  # from 127.0.0.1
    for _, w in flood:
        w.close()
    writer.close()


async def test_a_byte_flipped_in_flight_closes_the_link_naming_the_peer(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A man in the middle alters one byte of an answer after the handshake: the link fails
    authentication and closes (logged with the peer's id), the fetch tries again on a new
    link, and nothing after the handshake was readable on the wire."""
    caplog.set_level(logging.INFO)
    server, fetcher = await cluster.add(), await cluster.add()
    payload = os.urandom(50_000)
    digest = server.publish_blob(payload)
    # server → fetcher: Challenge, Proof (in the clear), then BlobHeader, Chunk, ...
    proxy = await TamperProxy(int(server.address.rsplit(":", 1)[1]), [Flip(0, DOWN, 3)]).serve()
    try:
        fetcher.set_peers({server.peer_id: f"127.0.0.1:{proxy.port}"})
        assert await fetcher.fetch_blob(digest, [server.peer_id], expected_size=len(payload)) == (
            payload
        )
    finally:
        await proxy.aclose()
    assert proxy.flipped == [Flip(0, DOWN, 3)] and len(proxy.captures) >= 2
    assert any(
        "failed authentication" in r.getMessage() and server.identity.short_id in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    for capture in proxy.captures:
        wire = b"".join(capture.up[2:]) + b"".join(capture.down[2:])
        for text in (b"BlobHeader", b"Chunk", b"sid", digest, payload[:64]):
            assert text not in wire
