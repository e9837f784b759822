"""`psyche_server.reachability`: the connect-back probe on real loopback sockets (a real P2P
node, the right and the wrong key, dead, silent and foreign listeners: only a yes or a no comes
back, never the far end's bytes), and the checker's bookkeeping with a fake probe."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from psyche_client.p2p import P2PConfig, P2PNode
from psyche_common.protocol import Identity, encode_frame
from psyche_server.reachability import (
    REACHABLE_DETAIL,
    UNREACHABLE_DETAIL,
    ProbeFailure,
    ProbeResult,
    ReachabilityChecker,
    probe_p2p,
)

pytestmark = pytest.mark.timeout(30)


async def serve(handler: object) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_p2p_node_proves_its_key_and_only_its_key() -> None:
    identity = Identity.generate()
    node = P2PNode(identity, is_member=lambda _p: False, config=P2PConfig(bind_host="127.0.0.1"))
    await node.start()
    try:
        result = await probe_p2p(identity.public_key, node.address, timeout=2)
        assert result == ProbeResult(True) and result.detail == REACHABLE_DETAIL
        # another joiner advertising this node's address is not reachable there
        other = await probe_p2p(Identity.generate().public_key, node.address, timeout=2)
        assert other == ProbeResult(False, ProbeFailure.WRONG_KEY)
        assert other.detail == UNREACHABLE_DETAIL
        await asyncio.sleep(0.1)
        assert not node.inbound.conns  # the probe's stream ended with the proof
    finally:
        await node.close()


async def test_a_listener_that_only_sends_a_challenge_is_not_reachable() -> None:
    async def half(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(encode_frame({"type": "Challenge", "challenge": bytes(32)}))
        await w.drain()
        await asyncio.sleep(5)

    server, address = await serve(half)
    async with server:
        result = await probe_p2p(bytes(32), address, timeout=0.3)
        assert result == ProbeResult(False, ProbeFailure.TIMEOUT)


async def test_dead_silent_and_foreign_listeners_are_not_and_nothing_of_theirs_is_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    result = await probe_p2p(bytes(32), dead, timeout=2)
    assert result == ProbeResult(False, ProbeFailure.CONNECT)
    received: list[bytes] = []

    async def silent(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async def ssh(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n")
        await w.drain()
        received.append(await r.read(1024))

    async def http(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await w.drain()

    cases = (
        (silent, ProbeFailure.TIMEOUT),
        (ssh, ProbeFailure.HANDSHAKE),
        (http, ProbeFailure.HANDSHAKE),
    )
    for handler, failure in cases:
        server, address = await serve(handler)
        async with server:
            result = await probe_p2p(bytes(32), address, timeout=0.3)
            assert result == ProbeResult(False, failure), result
            assert result.detail == UNREACHABLE_DETAIL
    assert received == [b""], "the probe sends nothing to a listener that is not a P2P one"
    for text in ("SSH", "HTTP", "1397966893"):  # the bytes, or them read as a length prefix
        assert text not in caplog.text


async def test_checker_records_verdicts_and_reports_them() -> None:
    verdicts = {"10.0.0.1:1": True, "10.0.0.2:1": False}
    reported: list[tuple[bytes, str, bool]] = []

    async def fake_probe(_client: bytes, address: str) -> ProbeResult:
        await asyncio.sleep(0.01)
        return ProbeResult(verdicts[address])

    checker = ReachabilityChecker(
        lambda cid, address, result: reported.append((cid, address, result.reachable)),
        probe=fake_probe,
    )
    a, b, c = b"a" * 32, b"b" * 32, b"c" * 32
    checker.check(a, "10.0.0.1:1")
    checker.check(b, "10.0.0.2:1")
    assert checker.unreachable([a, b, c]) == []  # not probed yet: assumed reachable
    await asyncio.sleep(0.1)
    assert checker.unreachable([a, b, c]) == [b]
    assert sorted(reported) == [(a, "10.0.0.1:1", True), (b, "10.0.0.2:1", False)]
    checker.forget(b)
    assert checker.unreachable([a, b, c]) == []
    await checker.close()
