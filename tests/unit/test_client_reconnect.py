"""Reconnecting to the server: the backoff schedule, the give-up time, what is final, and the
uplink that drops messages while there is no connection (scripted loopback servers)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import pytest
from psyche_client.session.reconnect import Backoff, ServerSession, SessionStatus
from psyche_client.session.server_link import (
    ServerLink,
    ServerLinkError,
    ServerRejected,
    WrongServerKey,
)
from psyche_client.session.uplink import SwitchableUplink
from psyche_common.coordinator.committee import WitnessProof
from psyche_common.coordinator.types import Witness
from psyche_common.protocol import (
    Identity,
    SecureChannel,
    accept_handshake,
    coordinator_domain,
)
from psyche_common.protocol.messages import (
    WitnessMetadata,
    already_connected_reason,
    parse_client_message,
)

FAST = Backoff(initial=0.05, factor=2.0, cap=0.2, jitter=0.2)

Script = Callable[[int, SecureChannel, asyncio.StreamWriter], Awaitable[None]]


def state(n: int) -> dict:
    return {"type": "CoordinatorState", "coordinator": {"n": n}, "peers": {}}


class ScriptedServer:
    """Accepts connections, records who joined, and plays `script(connection_number, ...)`."""

    def __init__(self, script: Script, identity: Identity | None = None) -> None:
        self.script = script
        self.identity = identity or Identity.generate()
        """The server's key (a test may change it between connections)."""
        self.joins: list[tuple[bytes, str]] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self.release = asyncio.Event()
        """Set by `stop()`: scripts that hold a connection open wait for it."""
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self, port: int = 0) -> ScriptedServer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self.server is not None
        self.release.set()
        self.server.close()
        await asyncio.wait_for(asyncio.gather(*self._handlers, return_exceptions=True), 5)
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            accepted = await accept_handshake(
                reader, writer, self.identity, domain=coordinator_domain("run")
            )
            channel = accepted.channel
            join = parse_client_message(await channel.read(timeout=5))
            self.joins.append((accepted.peer_key, join.p2p_address))
            await self.script(len(self.joins), channel, writer)
        finally:
            writer.close()


def session_for(
    server: ScriptedServer,
    identity: Identity,
    give_up_after: float,
    server_key: bytes | None = None,
) -> ServerSession:
    async def connect(timeout: float) -> ServerLink:
        return await ServerLink.connect(
            f"127.0.0.1:{server.port}",
            identity,
            "run",
            "127.0.0.1:7000",
            timeout=timeout,
            server_key=server_key,
        )

    return ServerSession(connect, give_up_after, FAST)


async def collect(session: ServerSession, into: list[int]) -> None:
    async for update in session.updates():
        into.append(update.coordinator["n"])


def test_backoff_doubles_up_to_the_cap_with_bounded_jitter() -> None:
    backoff = Backoff()
    assert [backoff.base(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.delay(1, 0.5) == 0.5  # unit 0.5: no jitter
    assert backoff.delay(3, 0.0) == pytest.approx(1.6)  # -20 %
    assert backoff.delay(3, 0.999999) == pytest.approx(2.4, rel=1e-5)  # +20 %
    assert backoff.delay(10_000, 0.5) == 10.0  # no overflow after a very long outage
    with pytest.raises(ValueError, match="attempt 0"):
        backoff.base(0)


def test_status_describes_the_reconnection() -> None:
    status = SessionStatus(connected=False, attempt=3, lost_at=10.0, next_attempt_at=14.0)
    assert status.describe(12.0) == "reconnecting (attempt 3, next in 2 s)"
    assert SessionStatus(connected=True).describe(0.0) == "connected"


async def test_reconnects_with_the_same_identity_after_the_server_closes(caplog) -> None:
    caplog.set_level(logging.INFO)

    async def script(number: int, channel, writer) -> None:
        await channel.send(state(number))
        if number > 1:
            await server.release.wait()
        # the first connection closes after one state: the server went away

    server = ScriptedServer(script)
    await server.start()
    identity = Identity.generate()
    session = session_for(server, identity, give_up_after=30)
    await session.open()
    seen: list[int] = []
    task = asyncio.create_task(collect(session, seen))
    try:
        async with asyncio.timeout(10):
            while seen != [1, 2]:
                await asyncio.sleep(0.02)
        assert session.reconnects == 1 and session.status.connected
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await session.aclose()
        await server.stop()
    assert server.joins == [(identity.public_key, "127.0.0.1:7000")] * 2
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("server connection lost: reconnecting (attempt 1") for m in messages)
    assert "reconnected to the server" in messages


async def test_gives_up_after_the_configured_time() -> None:
    async def script(number: int, channel, writer) -> None:
        await channel.send(state(number))
        writer.close()

    server = await ScriptedServer(script).start()
    session = session_for(server, Identity.generate(), give_up_after=1.0)
    await session.open()
    seen: list[int] = []
    updates = session.updates()
    seen.append((await anext(updates)).coordinator["n"])
    await server.stop()  # nobody listens any more: every attempt is refused
    lost = time.monotonic()
    with pytest.raises(ServerLinkError, match=r"gave up reconnecting after 1 s \(\d+ attempts"):
        await anext(updates)
    elapsed = time.monotonic() - lost
    assert 1.0 <= elapsed < 3.0, elapsed
    assert session.status.attempt >= 4  # 0.05, 0.1, 0.2, 0.2, ... within the second
    assert seen == [1]


async def test_zero_give_up_time_ends_at_once_like_before(caplog) -> None:
    caplog.set_level(logging.INFO)

    async def script(number: int, channel, writer) -> None:
        await channel.send(state(number))
        writer.close()

    server = await ScriptedServer(script).start()
    session = session_for(server, Identity.generate(), give_up_after=0)
    await session.open()
    updates = session.updates()
    await anext(updates)
    with pytest.raises(ServerLinkError, match=r"^server connection lost") as raised:
        await anext(updates)
    assert "gave up" not in str(raised.value)
    assert len(server.joins) == 1
    assert not any("reconnecting" in r.getMessage() for r in caplog.records)
    await server.stop()


async def test_a_wrong_run_id_is_final() -> None:
    async def script(number: int, channel, writer) -> None:
        await channel.send({"type": "Rejected", "reason": "unknown run id 'run'"})
        writer.close()

    server = await ScriptedServer(script).start()
    session = session_for(server, Identity.generate(), give_up_after=60)
    await session.open()
    with pytest.raises(ServerRejected, match="unknown run id") as raised:
        async with asyncio.timeout(5):
            await anext(session.updates())
    assert not raised.value.retryable
    assert len(server.joins) == 1
    await server.stop()


async def test_already_connected_is_retried() -> None:
    identity = Identity.generate()

    async def script(number: int, channel, writer) -> None:
        if number == 1:  # the server still holds our previous, dead connection
            reason = already_connected_reason(identity.short_id)
            await channel.send({"type": "Rejected", "reason": reason})
            writer.close()
        else:
            await channel.send(state(number))
            await server.release.wait()

    server = ScriptedServer(script)
    await server.start()
    session = session_for(server, identity, give_up_after=30)
    await session.open()
    async with asyncio.timeout(10):
        update = await anext(session.updates())
    assert update.coordinator["n"] == 2
    await session.aclose()
    await server.stop()


async def test_the_uplink_drops_messages_without_a_connection(caplog) -> None:
    caplog.set_level(logging.INFO)
    uplink = SwitchableUplink()
    await uplink.send_witness(Witness(WitnessProof(0, 0, True)), WitnessMetadata(step=3))
    await uplink.send_health_check([], 3, b"\x00" * 32)
    assert uplink.dropped == 2
    assert any("Witness not sent: no server connection" in r.getMessage() for r in caplog.records)

    async def script(number: int, channel, writer) -> None:
        writer.transport.abort()  # a reset: the client's next write fails

    server = await ScriptedServer(script).start()
    link = await ServerLink.connect(
        f"127.0.0.1:{server.port}", Identity.generate(), "run", "127.0.0.1:7000"
    )
    uplink.attach(link)
    async with asyncio.timeout(10):
        while uplink.dropped == 2:  # the send fails once the reset arrives: dropped, no raise
            await uplink.send_join()
            await asyncio.sleep(0.05)
    assert uplink.dropped == 3
    await server.stop()


async def test_a_server_with_another_key_is_refused_and_not_retried() -> None:
    """`--server-key`: the first connection to another server fails at once; a server that
    comes back with another key after a loss ends the session instead of being retried."""
    expected = Identity.generate()

    async def script(number: int, channel, writer) -> None:
        await channel.send(state(number))
        server.identity = Identity.generate()  # "restarted" with another key
        writer.close()

    server = await ScriptedServer(script, identity=Identity.generate()).start()
    with pytest.raises(WrongServerKey, match="not the expected"):
        await session_for(server, Identity.generate(), 60, expected.public_key).open()
    assert server.joins == []  # refused before the client signed anything for it
    server.identity = expected
    session = session_for(server, Identity.generate(), 60, expected.public_key)
    await session.open()
    updates = session.updates()
    await anext(updates)
    started = time.monotonic()
    with pytest.raises(WrongServerKey, match=expected.public_key.hex()):
        await anext(updates)
    assert time.monotonic() - started < 5  # not retried until the 60 s give-up time
    assert len(server.joins) == 1
    await server.stop()
