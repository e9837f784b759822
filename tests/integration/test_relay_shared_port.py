"""The relay on the coordinator port (in-process server, real sockets): the handshake's domain
picks the service, so joined clients get listen channels and pipes there while the coordinator
keeps serving the same port, and a relay signature never reaches the coordinator."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from psyche_client.p2p.connection import PeerUnavailable
from psyche_client.p2p.relay import RelayClient
from psyche_common.protocol import (
    ConnectionClosed,
    HandshakeError,
    Identity,
    connect_handshake,
    relay_domain,
)
from psyche_server.relay import RelayServer

from bench.harness.protocol_client import ProtocolClient
from tests.support.p2p import dead_address
from tests.support.server_harness import poll_until, running_server, write_state

pytestmark = pytest.mark.timeout(60)


def _members(app: object) -> set[bytes]:
    return {client.id for client in app.coordinator.epoch_state.clients}  # type: ignore[attr-defined]


async def test_joined_clients_pipe_through_the_coordinator_port(tmp_path: Path) -> None:
    """Members pipe to each other; a client that only joined (not an epoch member) can keep a
    listen channel but open no pipe to a member."""
    state = write_state(tmp_path / "state.toml", init_min_clients=2, warmup_time=30)
    async with running_server(state) as app:
        assert app.relay is not None and app.relay.port == app.port
        a = ProtocolClient(app.port, app.run_id, p2p_address=dead_address(), auto=False)
        b = ProtocolClient(app.port, app.run_id, p2p_address=dead_address(), auto=False)
        await a.connect()
        await b.connect()
        await poll_until(lambda: a.reachability and b.reachability, timeout=15)
        assert a.reachability[0].relay_port == app.port
        await poll_until(lambda: _members(app) == {a.id, b.id}, timeout=15)
        late = ProtocolClient(app.port, app.run_id, p2p_address=dead_address(), auto=False)
        await late.connect()
        await poll_until(lambda: late.reachability, timeout=15)

        piped: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_incoming(
            peer: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            await piped.put(peer + await reader.readexactly(5))
            writer.close()

        relay_a = RelayClient(a.identity, "127.0.0.1", app.port, app.run_id, on_incoming)
        relay_b = RelayClient(b.identity, "127.0.0.1", app.port, app.run_id, on_incoming)
        relay_b.start()
        try:
            await poll_until(lambda: relay_b.listening, timeout=10)
            _reader, writer = await relay_a.open_pipe(b.id)
            writer.write(b"hello")
            await writer.drain()
            assert await asyncio.wait_for(piped.get(), 10) == a.id + b"hello"
            writer.close()
            assert app.relay.stats.pipes_total == 1
            # the coordinator connections of both clients are untouched by their relay sockets
            assert set(app.connections.connections) == {a.id, b.id, late.id}
            relay_late = RelayClient(late.identity, "127.0.0.1", app.port, app.run_id, on_incoming)
            with pytest.raises(PeerUnavailable, match="not a member of the current epoch"):
                await relay_late.open_pipe(b.id)
            await relay_late.close()
            assert app.relay.pipes_of(b.id) == 0
        finally:
            await relay_a.close()
            await relay_b.close()
            await a.close()
            await b.close()
            await late.close()


async def test_a_relay_signature_is_refused_unless_joined(tmp_path: Path) -> None:
    """A key that signed for the relay but never joined gets a refusal from the relay, and is
    no coordinator connection."""
    state = write_state(tmp_path / "state.toml", init_min_clients=3)
    async with running_server(state) as app:
        assert app.relay is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
        stranger = Identity.generate()
        channel = await connect_handshake(
            reader, writer, stranger, domain=relay_domain(app.run_id), timeout=5
        )
        channel.write({"type": "RelayListen"})
        try:
            frame = await channel.read(4096, timeout=5)
        except ConnectionClosed:
            frame = None
        assert isinstance(frame, dict) and frame["type"] == "Rejected", frame
        assert "is not a joined client of this run" in frame["reason"]
        assert stranger.public_key not in app.connections.connections
        assert app.relay.stats.refused == 1
        writer.close()


async def test_a_relay_signature_of_another_run_is_refused_by_the_handshake(
    tmp_path: Path,
) -> None:
    state = write_state(tmp_path / "state.toml", init_min_clients=3)
    async with running_server(state) as app:
        reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
        with pytest.raises(HandshakeError, match="handshake with the coordinator"):
            await connect_handshake(
                reader, writer, Identity.generate(), domain=relay_domain("another-run"), timeout=5
            )
        assert app.connections.rejected_connections == 1
        writer.close()


async def test_a_relay_on_the_coordinator_port_logs_its_total_at_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """bench/netlab.py reads the relayed bytes from this line; a relay that shares the
    coordinator port has no listener of its own and once logged nothing."""
    relay = RelayServer("run", lambda _peer: True)
    relay.serve_on_shared_port(20000)
    with caplog.at_level(logging.INFO, logger="psyche.server.relay"):
        await relay.close()
    totals = [getattr(r, "relay_forwarded_bytes", None) for r in caplog.records]
    assert 0 in totals
