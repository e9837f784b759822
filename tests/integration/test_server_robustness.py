"""Every bad peer ends only its own connection, with a logged reason; honest clients go on."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import ConvictionKind
from psyche_common.coordinator.verdicts import Conviction
from psyche_common.protocol import (
    Identity,
    SecureChannel,
    connect_handshake,
    coordinator_domain,
    data_server_domain,
    encode_frame,
    read_frame,
    sign_challenge,
    write_frame,
)
from psyche_common.protocol.handshake import read_server_hello
from psyche_common.protocol.messages import Join, to_wire
from psyche_common.protocol.secure_channel import EphemeralKey
from psyche_server.connections import ConnectionLimits

from bench.harness.protocol_client import ProtocolClient
from tests.support.server_harness import poll_until, running_server, write_state

LIMITS = ConnectionLimits(max_frame_size=64 * 1024, handshake_timeout=1.0)


async def authenticated_stream(app, identity: Identity | None = None) -> SecureChannel:
    reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
    domain = coordinator_domain(app.run_id)
    channel = await connect_handshake(
        reader, writer, identity or Identity.generate(), domain=domain, timeout=5
    )
    await channel.send(to_wire(Join(run_id=app.run_id, p2p_address="127.0.0.1:1")))
    await channel.read(1 << 24, timeout=5)  # the state sent on Join
    return channel


async def assert_closed(
    source: asyncio.StreamReader | SecureChannel, timeout: float = 5
) -> list[object]:
    """Read until EOF; returns the frames received before the close (decrypted when `source`
    is an encrypted link, else in the clear: before or during a handshake)."""
    frames: list[object] = []
    async with asyncio.timeout(timeout):
        while True:
            try:
                if isinstance(source, SecureChannel):
                    frames.append(await source.read(1 << 24))
                else:
                    frames.append(await read_frame(source, 1 << 24))
            except Exception:
                return frames


async def assert_still_served(honest: ProtocolClient) -> None:
    seen = honest.states_received
    await poll_until(lambda: honest.states_received > seen + 1, timeout=5)
    assert honest.connected


def reason_logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


@pytest.fixture
async def server(tmp_path: Path):
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, limits=LIMITS) as app:
        yield app


@pytest.fixture
async def honest(server) -> ProtocolClient:
    client = await ProtocolClient(server.port, server.run_id, auto=False).connect()
    await poll_until(lambda: len(server.pending) == 1)
    yield client
    await client.close()


def _sealed(obj: object) -> Callable[[SecureChannel], bytes]:
    return lambda channel: channel.seal(obj)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (lambda _channel: struct.pack(">I", 1 << 20), "exceeds the maximum of 65536 bytes"),
        (lambda channel: channel.seal_payload(b"\xc1\xc1"), "invalid msgpack"),
        (_sealed({"type": "Launch", "x": 1}), "unknown message type 'Launch'"),
        (_sealed([1, 2, 3]), "a message must be a map"),
        (_sealed({"type": "Join", "run_id": 5, "p2p_address": "a:1"}), "Join.run_id"),
        (_sealed({"type": "HealthCheck", "checks": [{"id": b"x", "proof": {}}]}), "checks.id"),
        (_sealed({"type": "WarmupWitness", "witness": {"proof": 7}}), "WarmupWitness.witness"),
        (_sealed({"type": "Checkpoint", "checkpoint": {"Nope": {}}}), "Checkpoint.checkpoint"),
        (lambda _channel: encode_frame({"type": "HealthCheck"}), "failed authentication"),
    ],
    ids=[
        "too-large",
        "bad-msgpack",
        "unknown-type",
        "not-a-map",
        "bad-field",
        "short-id",
        "bad-witness",
        "bad-checkpoint",
        "not-encrypted",
    ],
)
async def test_bad_frames_end_only_that_connection(
    server,
    honest: ProtocolClient,
    caplog: pytest.LogCaptureFixture,
    payload: Callable[[SecureChannel], bytes],
    reason: str,
) -> None:
    caplog.set_level(logging.INFO)
    channel = await authenticated_stream(server)
    writer = channel.writer
    writer.write(payload(channel))
    await writer.drain()
    await assert_closed(channel)
    await poll_until(lambda: reason_logged(caplog, reason))
    await assert_still_served(honest)
    assert len(server.connections.connections) == 1
    writer.close()


async def test_wrong_run_id_is_rejected_with_reason(server, honest: ProtocolClient, caplog) -> None:
    caplog.set_level(logging.INFO)
    intruder = ProtocolClient(server.port, "some-other-run", auto=False)
    await intruder.connect(handshake_run_id=server.run_id)
    await intruder.wait_closed()
    assert intruder.rejected is not None and "unknown run id 'some-other-run'" in intruder.rejected
    assert intruder.id not in server.pending
    assert reason_logged(caplog, "tried to join unknown run")
    await assert_still_served(honest)


async def test_a_key_banned_on_proof_is_refused_at_join(
    server, honest: ProtocolClient, caplog
) -> None:
    """A key convicted on proof can never be seated again: its Join is refused with the
    reason, rather than left waiting in the pending set for ever."""
    caplog.set_level(logging.INFO)
    banned = Identity.generate()
    server.coordinator.verification.ban(
        Conviction(
            epoch=0,
            step=3,
            trainer=banned.public_key,
            batch=BatchId(0, 1),
            verifiers=(honest.id,),
            agreement_milli=0,
            kind=ConvictionKind.PROVEN,
        )
    )
    intruder = ProtocolClient(server.port, server.run_id, banned, auto=False)
    await intruder.connect()
    await intruder.wait_closed()
    assert intruder.rejected is not None
    assert "banned from this run: convicted at step 3 of epoch 0" in intruder.rejected
    assert banned.public_key not in server.pending
    assert reason_logged(caplog, "refusing the Join of")
    await assert_still_served(honest)


async def test_handshake_for_another_run_is_refused_with_reason(
    server, honest: ProtocolClient, caplog
) -> None:
    caplog.set_level(logging.INFO)
    stranger = ProtocolClient(server.port, "some-other-run", auto=False)
    await stranger.connect()  # signs the challenge for the coordinator of "some-other-run"
    await stranger.wait_closed()
    assert stranger.rejected is not None
    assert f"handshake with the coordinator of run {server.run_id!r} failed" in stranger.rejected
    assert stranger.id not in server.connections.connections
    assert reason_logged(caplog, "does not verify for this service")
    await assert_still_served(honest)


async def test_data_server_signature_is_refused_by_the_coordinator(
    server, honest: ProtocolClient, caplog
) -> None:
    caplog.set_level(logging.INFO)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    hello = read_server_hello(await read_frame(reader, 1 << 20, timeout=5))
    response = sign_challenge(
        Identity.generate(), hello, data_server_domain(server.run_id), EphemeralKey()
    )
    await write_frame(writer, response)
    frames = await assert_closed(reader)
    assert [f["type"] for f in frames] == ["Rejected"]
    assert "does not verify" in frames[0]["reason"]
    assert len(server.connections.connections) == 1
    await assert_still_served(honest)
    writer.close()


async def test_bad_signature_fails_handshake(server, honest: ProtocolClient, caplog) -> None:
    caplog.set_level(logging.INFO)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    hello = read_server_hello(await read_frame(reader, 1 << 20, timeout=5))
    response = sign_challenge(
        Identity.generate(), hello, coordinator_domain(server.run_id), EphemeralKey()
    )
    response["public_key"] = Identity.generate().public_key  # signed by someone else
    await write_frame(writer, response)
    frames = await assert_closed(reader)
    assert [f["type"] for f in frames] == ["Rejected"]
    await poll_until(lambda: reason_logged(caplog, "signature does not verify"))
    await assert_still_served(honest)


async def test_a_small_order_key_is_refused_with_the_reason(
    server, honest: ProtocolClient, caplog
) -> None:
    """The identity point as a key: R = identity, S = 0 verifies under it for any transcript
    (no secret at all), so the server must refuse the key itself, and says why."""
    caplog.set_level(logging.INFO)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    hello = read_server_hello(await read_frame(reader, 1 << 20, timeout=5))
    response = sign_challenge(
        Identity.generate(), hello, coordinator_domain(server.run_id), EphemeralKey()
    )
    response["public_key"] = (1).to_bytes(32, "little")  # the identity point
    response["signature"] = (1).to_bytes(32, "little") + bytes(32)  # R = identity, S = 0
    await write_frame(writer, response)
    frames = await assert_closed(reader)
    assert [f["type"] for f in frames] == ["Rejected"]
    assert "small order" in frames[0]["reason"]
    assert len(server.connections.connections) == 1
    await poll_until(lambda: reason_logged(caplog, "is an ed25519 point of small order"))
    await assert_still_served(honest)
    writer.close()


async def test_duplicate_identity_is_refused(server, honest: ProtocolClient) -> None:
    twin = ProtocolClient(server.port, server.run_id, identity=honest.identity, auto=False)
    await twin.connect(join=False)
    await twin.wait_closed()
    assert twin.rejected is not None and "already connected" in twin.rejected
    await assert_still_served(honest)
    assert honest.id in server.pending


async def test_silent_client_times_out_in_handshake(server, honest: ProtocolClient, caplog) -> None:
    caplog.set_level(logging.INFO)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    frames = await assert_closed(reader, timeout=5)
    assert [f["type"] for f in frames] == ["Challenge"]
    assert reason_logged(caplog, "no handshake within 1s")
    await assert_still_served(honest)
    writer.close()


async def test_client_that_stops_reading_is_disconnected(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    limits = ConnectionLimits(
        max_frame_size=64 * 1024,
        handshake_timeout=1.0,
        max_buffered_send_bytes=16 * 1024,
        socket_send_buffer=4096,
    )
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, limits=limits, tick_interval=0.02) as app:
        honest = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", app.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        stalled = Identity.generate()
        channel = await connect_handshake(
            reader, writer, stalled, domain=coordinator_domain(app.run_id), timeout=5
        )
        await channel.send(to_wire(Join(run_id=app.run_id, p2p_address="127.0.0.1:1")))
        # never read again: the server's bounded queue fills and it drops us
        await poll_until(lambda: reason_logged(caplog, "peer is not reading"), timeout=30)
        await poll_until(lambda: stalled.public_key not in app.connections.connections)
        assert stalled.public_key not in app.pending
        await assert_still_served(honest)
        await honest.close()
        writer.transport.abort()


async def test_flooding_client_is_disconnected(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    limits = ConnectionLimits(handshake_timeout=1.0, messages_per_second=20, message_burst=50)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, limits=limits) as app:
        honest = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        channel = await authenticated_stream(app)
        report = {"type": "HealthCheck", "checks": [], "step": 1, "weights_hash": bytes(32)}
        for _ in range(200):
            channel.write(report)
        await channel.writer.drain()
        frames = await assert_closed(channel)
        assert frames[-1]["type"] == "Rejected" and "messages/s" in frames[-1]["reason"]
        await assert_still_served(honest)
        await honest.close()


async def test_connection_limit(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    limits = ConnectionLimits(handshake_timeout=2.0, max_connections=3)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, limits=limits) as app:
        honest = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        idle = [await asyncio.open_connection("127.0.0.1", app.port) for _ in range(2)]
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
        assert await assert_closed(reader) == []
        assert reason_logged(caplog, "connections open (limit)")
        await assert_still_served(honest)
        for _, w in [*idle, (reader, writer)]:
            w.close()
        await honest.close()


async def test_connection_that_never_joins_gets_no_state_and_is_closed(
    tmp_path: Path, caplog
) -> None:
    caplog.set_level(logging.INFO)
    limits = ConnectionLimits(handshake_timeout=1.0, pre_join_timeout=0.5)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, limits=limits, tick_interval=0.05) as app:
        honest = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
        lurker = Identity.generate()
        domain = coordinator_domain(app.run_id)
        channel = await connect_handshake(reader, writer, lurker, domain=domain, timeout=5)
        frames = await assert_closed(channel)
        # ten ticks went by, and it saw none of them: only the reason it was closed
        assert [f["type"] for f in frames] == ["Rejected"]
        assert "no Join within 0.5s" in frames[0]["reason"]
        assert reason_logged(caplog, "no Join within 0.5s")
        assert lurker.public_key not in app.connections.connections
        await assert_still_served(honest)
        await honest.close()
        writer.close()


async def test_connections_per_ip_are_capped(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    limits = ConnectionLimits(handshake_timeout=2.0, max_connections_per_ip=2)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, limits=limits) as app:
        honest = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        idle = await asyncio.open_connection("127.0.0.1", app.port)
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
        assert await assert_closed(reader) == []
        assert reason_logged(caplog, "connections open from 127.0.0.1 (--max-connections-per-ip 2)")
        await assert_still_served(honest)
        # a closed connection frees its slot
        idle[1].close()
        await poll_until(lambda: len(app.connections._writers) == 1)
        again = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        await poll_until(lambda: again.id in app.pending)
        writer.close()
        await asyncio.gather(honest.close(), again.close())


async def test_a_burst_of_messages_costs_one_tick_not_one_per_message(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    async with running_server(state, tick_interval=60) as app:
        channel = await authenticated_stream(app)
        writer = channel.writer
        await poll_until(lambda: app.stats.message_ticks >= 1)  # the Join's
        messages, ticks = app.stats.messages, app.stats.ticks
        report = {"type": "HealthCheck", "checks": [], "step": 1, "weights_hash": bytes(32)}
        writer.write(b"".join(channel.seal(report) for _ in range(200)))
        await writer.drain()
        await poll_until(lambda: app.stats.messages == messages + 200)
        await asyncio.sleep(0.1)
        assert app.stats.ticks - ticks <= 10, "one key's burst must not drive 200 ticks"
        writer.close()
