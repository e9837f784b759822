"""Per-peer serving slots on real P2P nodes: one peer holding requests open (a slow reader)
takes at most `max_serving_per_peer` of the node's `max_concurrent_serving` slots, so every
other peer is still served."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from psyche_client.p2p import P2PConfig, P2PNode
from psyche_common.protocol import Identity

pytestmark = pytest.mark.timeout(60)

FAST = P2PConfig(
    bind_host="127.0.0.1",
    connect_timeout=1.0,
    read_timeout=2.0,
    fetch_deadline=10.0,
    retry_backoff=0.01,
)


async def test_one_peer_cannot_hold_every_serving_slot() -> None:
    release = asyncio.Event()
    running: list[str] = []
    loop = asyncio.get_running_loop()

    def parameter(name: str) -> bytes:
        running.append(name)
        if name.startswith("hog"):  # the hog's requests are held until released
            asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)
        return b"p" * 100

    config = dataclasses.replace(FAST, max_concurrent_serving=4, max_serving_per_peer=2)
    server = P2PNode(
        Identity.generate(), is_member=lambda _p: True, config=config, get_parameter_bytes=parameter
    )
    await server.start()
    hog = P2PNode(Identity.generate(), is_member=lambda _p: True, config=FAST)
    victim = P2PNode(Identity.generate(), is_member=lambda _p: True, config=FAST)
    await hog.start()
    await victim.start()
    try:
        for node in (hog, victim):
            node.set_peers({server.peer_id: server.address})
        held = [
            asyncio.ensure_future(
                hog.request_stream(
                    server.peer_id, {"type": "GetParameter", "name": f"hog{i}"}, max_size=1000
                )
            )
            for i in range(6)
        ]
        async with asyncio.timeout(5):
            while len(running) < 2:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert len(running) == 2, running
        assert server._requests.serving(hog.peer_id) == 6  # 2 served, 4 waiting for its slots
        # the victim is served at once, though the hog has six requests open
        async with asyncio.timeout(3):
            answer = await victim.request_stream(
                server.peer_id, {"type": "GetParameter", "name": "fresh"}, max_size=1000
            )
        assert answer.data == b"p" * 100
        assert len([n for n in running if n.startswith("hog")]) == 2
        release.set()
        results = await asyncio.gather(*held)
        assert [r.data for r in results] == [b"p" * 100] * 6
        assert server._requests.serving(hog.peer_id) == 0  # the table entry is gone
    finally:
        release.set()
        for node in (server, hog, victim):
            await node.close()


async def test_a_peers_blob_request_does_not_wait_behind_its_own_model_download() -> None:
    """A joiner downloading the model holds every one of its model slots at the holder; a
    round's result it asks for meanwhile is served at once (once it waited for them, and a
    result fetched during a model share arrived only with the model's last chunk)."""
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def parameter(name: str) -> bytes:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)
        return b"p" * 100

    config = dataclasses.replace(FAST, max_concurrent_serving=8, max_serving_per_peer=2)
    server = P2PNode(
        Identity.generate(), is_member=lambda _p: True, config=config, get_parameter_bytes=parameter
    )
    await server.start()
    joiner = P2PNode(Identity.generate(), is_member=lambda _p: True, config=FAST)
    await joiner.start()
    try:
        joiner.set_peers({server.peer_id: server.address})
        blob = server.publish_blob(b"r" * 500, step=1)
        downloads = [
            asyncio.ensure_future(
                joiner.request_stream(
                    server.peer_id, {"type": "GetParameter", "name": f"p{i}"}, max_size=1000
                )
            )
            for i in range(4)
        ]
        async with asyncio.timeout(5):
            while server._requests.serving(joiner.peer_id) < 4:
                await asyncio.sleep(0.01)
        async with asyncio.timeout(3):
            data = await joiner.fetch_blob(blob, [server.peer_id], expected_size=500)
        assert data == b"r" * 500
        assert not any(d.done() for d in downloads)  # the model is still held
        release.set()
        await asyncio.gather(*downloads)
    finally:
        release.set()
        for node in (server, joiner):
            await node.close()
