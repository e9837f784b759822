"""Per-key limits of the coordinator port, on a real server: messages over a key's rate
are dropped (and a key that stays over it is disconnected), messages cannot drive ticks
faster than `max_message_ticks_per_second`, and a joined connection that stays silent for
`idle_timeout` is closed, while a real client's keepalive keeps a waiting client connected."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from psyche_client.session.server_link import ServerLink
from psyche_common.protocol import Identity, SecureChannel
from psyche_server.connections import ConnectionLimits

from bench.harness.protocol_client import ProtocolClient
from tests.support.server_harness import poll_until, running_server, write_state

from .test_server_robustness import (
    assert_closed,
    assert_still_served,
    authenticated_stream,
    reason_logged,
)

STATUS_MESSAGE = {"type": "HealthCheck", "checks": [], "step": 1, "weights_hash": bytes(32)}


def statuses(channel: SecureChannel, count: int) -> bytes:
    """`count` status messages sealed for `channel` (each with its own nonce)."""
    return b"".join(channel.seal(STATUS_MESSAGE) for _ in range(count))


async def test_messages_over_the_rate_are_dropped_without_closing(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    limits = ConnectionLimits(handshake_timeout=1.0, messages_per_second=0.01, message_burst=5)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, limits=limits) as app:
        identity = Identity.generate()
        channel = await authenticated_stream(app, identity)  # Join took one token
        writer = channel.writer
        before = app.stats.messages
        writer.write(statuses(channel, 8))  # 4 tokens left: 4 accepted, 4 dropped
        await writer.drain()
        await poll_until(lambda: app.connections.dropped_messages == 4)
        assert app.stats.messages - before == 4
        assert reason_logged(caplog, f"dropping messages from {identity.short_id}")
        assert identity.public_key in app.connections.connections  # still connected
        writer.transport.abort()


async def test_a_key_that_stays_over_its_rate_is_disconnected_naming_it(
    tmp_path: Path, caplog
) -> None:
    caplog.set_level(logging.INFO)
    limits = ConnectionLimits(handshake_timeout=1.0, messages_per_second=1, message_burst=5)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, limits=limits) as app:
        honest = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        identity = Identity.generate()
        channel = await authenticated_stream(app, identity)
        channel.writer.write(statuses(channel, 40))
        await channel.writer.drain()
        frames = await assert_closed(channel)
        assert frames[-1]["type"] == "Rejected"
        assert f"key {identity.short_id} sent more than 1 messages/s" in frames[-1]["reason"]
        assert reason_logged(caplog, f"{identity.short_id} disconnected: key {identity.short_id}")
        await assert_still_served(honest)
        await honest.close()


async def test_messages_cannot_drive_ticks_faster_than_the_limit(tmp_path: Path) -> None:
    limits = ConnectionLimits(
        handshake_timeout=1.0, messages_per_second=10_000, message_burst=10_000,
        max_message_ticks_per_second=10,
    )  # fmt: skip
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, limits=limits, tick_interval=5.0) as app:
        streams = [await authenticated_stream(app) for _ in range(3)]
        await asyncio.sleep(0.2)
        ticks, messages = app.stats.message_ticks, app.stats.messages
        started = time.monotonic()
        while time.monotonic() - started < 1.0:  # 3 keys, one message each every 5 ms
            for channel in streams:
                channel.write(STATUS_MESSAGE)
                await channel.writer.drain()
            await asyncio.sleep(0.005)
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.3)
        assert app.stats.messages - messages > 150
        assert app.stats.message_ticks - ticks <= 10 * (elapsed + 0.3) + 2
        for channel in streams:
            channel.abort()


async def test_a_silent_joined_connection_is_closed_after_the_idle_timeout(
    tmp_path: Path, caplog
) -> None:
    caplog.set_level(logging.INFO)
    limits = ConnectionLimits(handshake_timeout=1.0, idle_timeout=0.6)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, limits=limits) as app:
        identity = Identity.generate()
        channel = await authenticated_stream(app, identity)
        frames = await assert_closed(channel)
        assert frames[-1]["type"] == "Rejected"
        assert "no message for 0.6s (idle timeout)" in frames[-1]["reason"]
        assert identity.public_key not in app.connections.connections
        assert identity.public_key not in app.pending


async def test_a_waiting_client_keeps_its_connection_with_keepalives(tmp_path: Path) -> None:
    limits = ConnectionLimits(handshake_timeout=1.0, idle_timeout=0.6)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, limits=limits) as app:
        identity = Identity.generate()
        link = await ServerLink.connect(f"127.0.0.1:{app.port}", identity, app.run_id, "h:1")
        link.keepalive_interval = 0.2

        async def read_states() -> None:
            async for _ in link.states():
                pass

        reading = asyncio.create_task(read_states())
        await asyncio.sleep(2.0)  # more than three idle timeouts, waiting for members
        assert not reading.done()
        assert identity.public_key in app.connections.connections
        assert identity.public_key in app.pending
        assert link.keepalives_sent >= 3
        reading.cancel()
        await link.close()
