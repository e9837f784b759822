"""`psyche_server.reachability`: the connect-back probe on real loopback sockets, and the
checker's bookkeeping with a fake probe."""

from __future__ import annotations

import asyncio
import socket

import pytest
from psyche_common.protocol import encode_frame
from psyche_server.reachability import ProbeResult, ReachabilityChecker, probe_p2p

pytestmark = pytest.mark.timeout(30)


async def serve(handler: object) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_listener_that_sends_a_challenge_is_reachable() -> None:
    async def p2p(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(encode_frame({"type": "Challenge", "challenge": bytes(32)}))
        await w.drain()

    server, address = await serve(p2p)
    async with server:
        assert (await probe_p2p(address, timeout=2)).reachable


async def test_dead_silent_and_foreign_listeners_are_not() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    result = await probe_p2p(dead, timeout=2)
    assert not result.reachable and "cannot connect" in result.detail

    async def silent(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async def foreign(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await w.drain()

    for handler, expected in ((silent, "sent nothing within 0.3s"), (foreign, "P2P listener")):
        server, address = await serve(handler)
        async with server:
            result = await probe_p2p(address, timeout=0.3)
            assert not result.reachable and expected in result.detail, result


async def test_checker_records_verdicts_and_reports_them() -> None:
    verdicts = {"10.0.0.1:1": True, "10.0.0.2:1": False}
    reported: list[tuple[bytes, str, bool]] = []

    async def fake_probe(address: str) -> ProbeResult:
        await asyncio.sleep(0.01)
        return ProbeResult(verdicts[address], "fake")

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
