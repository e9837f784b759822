"""The client's server connection against a scripted loopback server."""

from __future__ import annotations

import asyncio

import pytest
from psyche_client.session.server_link import ServerLink, ServerLinkError, parse_server_addr
from psyche_common.config import HubCheckpoint
from psyche_common.protocol import (
    Identity,
    accept_handshake,
    coordinator_domain,
)
from psyche_common.protocol.messages import parse_client_message


async def scripted_server(script, run_id: str = "r"):
    received: list = []

    async def handle(reader, writer):
        accepted = await accept_handshake(
            reader, writer, Identity.generate(), domain=coordinator_domain(run_id)
        )
        received.append(("peer", accepted.peer_key))
        channel = accepted.channel
        received.append(parse_client_message(await channel.read()))
        await script(channel, writer, received)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, port, received


def state(n: int) -> dict:
    return {"type": "CoordinatorState", "coordinator": {"n": n}, "peers": {b"k" * 32: "1.2.3.4:5"}}


async def test_join_dedup_and_messages() -> None:
    async def script(channel, writer, received):
        for frame in (state(1), state(1), state(2)):
            await channel.send(frame)
        received.append(parse_client_message(await channel.read(timeout=5)))
        received.append(parse_client_message(await channel.read(timeout=5)))
        writer.close()

    server, port, received = await scripted_server(script, "run-x")
    identity = Identity.generate()
    async with server:
        link = await ServerLink.connect(f"127.0.0.1:{port}", identity, "run-x", "127.0.0.1:999")
        updates = []
        with pytest.raises(ServerLinkError, match="connection lost"):
            async for update in link.states():
                updates.append(update)
                if len(updates) == 2:
                    await link.send_health_check([], 3, b"\x01" * 32)
                    await link.send_checkpoint(HubCheckpoint(repo_id="a/b", revision="r"))
        await link.close()
    assert [u.coordinator["n"] for u in updates] == [1, 2]  # the repeated state is dropped
    assert updates[0].peers == {b"k" * 32: "1.2.3.4:5"}
    assert received[0] == ("peer", identity.public_key)
    join = received[1]
    assert join.run_id == "run-x" and join.p2p_address == "127.0.0.1:999"
    assert received[2].type == "HealthCheck" and received[2].step == 3
    assert received[3].type == "Checkpoint"
    assert received[3].checkpoint == {"Hub": {"repo_id": "a/b", "revision": "r"}}


async def test_every_join_says_whether_the_client_holds_the_weights_now() -> None:
    async def script(channel, writer, received):
        received.append(parse_client_message(await channel.read(timeout=5)))
        writer.close()

    server, port, received = await scripted_server(script)
    holds = [False]
    async with server:
        link = await ServerLink.connect(
            f"127.0.0.1:{port}",
            Identity.generate(),
            "r",
            "127.0.0.1:9",
            holds_model=lambda: holds[0],
        )
        holds[0] = True
        await link.send_join()  # once the model is loaded
        await asyncio.sleep(0.1)
        await link.close()
    assert [m.holds_model for m in received[1:]] == [False, True]


async def test_rejection_is_reported_with_its_reason() -> None:
    async def script(channel, writer, received):
        await channel.send({"type": "Rejected", "reason": "wrong run id"})
        writer.close()

    server, port, _ = await scripted_server(script)
    async with server:
        link = await ServerLink.connect(f"127.0.0.1:{port}", Identity.generate(), "r", "h:1")
        with pytest.raises(ServerLinkError, match="wrong run id"):
            async for _ in link.states():
                pass
        await link.close()


async def test_unreachable_server_and_bad_address() -> None:
    with pytest.raises(ServerLinkError, match="cannot connect"):
        await ServerLink.connect("127.0.0.1:1", Identity.generate(), "r", "h:1", timeout=2)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_server_addr("localhost")
    assert parse_server_addr("[::1]:80") == ("::1", 80)


async def test_silent_server_is_detected_as_lost() -> None:
    """Regression: a server that stops sending (no FIN/RST) used to block the client forever."""
    release = asyncio.Event()

    async def script(channel, writer, received):
        await channel.send(state(1))
        await release.wait()  # then silence, connection left open
        writer.close()

    server, port, _ = await scripted_server(script)
    async with server:
        link = await ServerLink.connect(f"127.0.0.1:{port}", Identity.generate(), "r", "h:1")
        link.silence_timeout = 0.5
        updates = []
        with pytest.raises(ServerLinkError, match=r"nothing received for 0\.5 s"):
            async with asyncio.timeout(10):
                async for update in link.states():
                    updates.append(update)
        assert len(updates) == 1
        release.set()
        await link.close()
