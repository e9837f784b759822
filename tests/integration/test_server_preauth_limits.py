"""Limits before authentication on a real server: handshake frames over a few KiB are refused
on the length prefix (coordinator and data-server ports, whatever `--max-frame-size`), and one
IP address may hold only `max_handshakes_per_ip` unauthenticated connections at once, while a
client from elsewhere (here: after the slots free up) still joins. Decode bombs (frames of
nested empty arrays) at the coordinator port, the data-server port and a P2P listener are
refused before anything of them is built."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from pathlib import Path

from psyche_client.p2p import P2PConfig, P2PNode
from psyche_common.protocol import (
    CONTROL_FRAME_SIZE,
    HANDSHAKE_FRAME_SIZE,
    Identity,
    SecureChannel,
    connect_handshake,
    coordinator_domain,
    read_frame,
)
from psyche_server.connections import Connection, ConnectionLimits, ConnectionManager

from bench.harness.protocol_client import ProtocolClient
from tests.support.server_harness import poll_until, running_server, write_state

from .test_server_robustness import assert_closed, reason_logged


async def _oversized_handshake(port: int, size: int) -> list[object]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await read_frame(reader, 1 << 16, timeout=5)  # the challenge
    writer.write(struct.pack(">I", size) + b"\x00" * 16)  # only the prefix matters
    await writer.drain()
    frames = await assert_closed(reader)
    writer.close()
    return frames


async def test_a_large_handshake_frame_is_refused_before_it_is_read(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    limits = ConnectionLimits(handshake_timeout=5.0, max_frame_size=64 * 1024 * 1024)
    async with running_server(state, limits=limits) as app:
        await _oversized_handshake(app.port, HANDSHAKE_FRAME_SIZE + 1)
        assert reason_logged(caplog, f"{HANDSHAKE_FRAME_SIZE + 1}")
        assert app.connections.rejected_connections == 1
        honest = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        await honest.wait_for(lambda c: True)
        await honest.close()


async def test_the_data_port_caps_handshake_frames_too(caplog) -> None:
    caplog.set_level(logging.INFO)

    async def ignore(_conn: object, _message: object) -> None:
        return None

    manager: ConnectionManager[object] = ConnectionManager(
        "data-server", lambda raw: raw, ignore, ConnectionLimits(), domain=b"data-test"
    )
    port = await manager.start("127.0.0.1", 0)
    try:
        await _oversized_handshake(port, 1 << 20)
        assert manager.rejected_connections == 1
        assert reason_logged(caplog, "1048576")
    finally:
        await manager.close()


async def test_one_address_holds_few_unauthenticated_connections(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    limits = ConnectionLimits(handshake_timeout=1.5, max_handshakes_per_ip=3)
    async with running_server(state, limits=limits) as app:
        silent = [await asyncio.open_connection("127.0.0.1", app.port) for _ in range(5)]
        await poll_until(lambda: app.connections.rejected_connections >= 2, timeout=5)
        assert reason_logged(caplog, "--max-handshakes-per-ip 3")
        # the silent ones time out, freeing the address's slots for an honest client
        await poll_until(lambda: not app.connections._handshaking_per_ip, timeout=10)
        honest = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        await honest.wait_for(lambda c: True)
        assert not app.connections._handshaking_per_ip  # authenticated: no longer counted
        await honest.close()
        for _, writer in silent:
            writer.close()


def _bomb_payload(size: int) -> bytes:
    """`size` bytes of one msgpack array of empty arrays (about 64 bytes of memory per byte
    once decoded, were it decoded); only its first 64 KiB when larger."""
    count = size - 5
    return b"\xdd" + count.to_bytes(4, "big") + b"\x90" * min(count, 1 << 16)


def _bomb(size: int, channel: SecureChannel | None = None) -> bytes:
    """A frame announcing `size` payload bytes of `_bomb_payload` (a refusal on the length
    prefix closes the socket before more could be written): in the clear during a handshake,
    sealed for `channel` after it when control-sized (so the server decrypts it and reaches
    its bounded decoder)."""
    if channel is not None and size <= CONTROL_FRAME_SIZE:
        return channel.seal_payload(_bomb_payload(size))
    return struct.pack(">I", size) + _bomb_payload(size)


async def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


async def _bomb_after_handshake(port: int, domain: bytes, size: int) -> list[object]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    channel = await connect_handshake(reader, writer, Identity.generate(), domain=domain, timeout=5)
    await _write(writer, _bomb(size, channel))
    frames = await assert_closed(reader)
    writer.close()
    return frames


async def test_decode_bombs_are_refused_cheaply_on_every_port(tmp_path: Path, caplog) -> None:
    """Nested-array frames at the coordinator port (in the handshake and before a Join), the
    data-server port and a P2P listener: refused on the length prefix or at the first
    oversized array header, nothing decoded, while an honest client keeps its connection."""
    caplog.set_level(logging.INFO)
    state = write_state(tmp_path / "s.toml", init_min_clients=3)
    limits = ConnectionLimits(handshake_timeout=5.0, max_frame_size=64 * 1024 * 1024)
    async with running_server(state, limits=limits) as app:
        honest = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        await honest.wait_for(lambda c: True)
        domain = coordinator_domain(app.run_id)
        started = time.monotonic()
        # in the handshake: 4 KiB of empty arrays (one wide array) and 1 MiB (on the prefix)
        for size in (HANDSHAKE_FRAME_SIZE, 1 << 20):
            reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
            await read_frame(reader, 1 << 16, timeout=5)  # the challenge
            await _write(writer, _bomb(size))
            await assert_closed(reader)
            writer.close()
        # authenticated, before a Join: a control frame too, whatever --max-frame-size
        await _bomb_after_handshake(app.port, domain, CONTROL_FRAME_SIZE)
        await _bomb_after_handshake(app.port, domain, 8 << 20)
        assert time.monotonic() - started < 5
        assert reason_logged(caplog, "exceeds max_array_len")
        assert reason_logged(caplog, f"exceeds the maximum of {CONTROL_FRAME_SIZE} bytes")
        assert app.connections.protocol_violations >= 2
        assert honest.connected and set(app.connections.connections) == {honest.id}
        await honest.close()


async def test_the_data_port_reads_only_control_frames(caplog) -> None:
    caplog.set_level(logging.INFO)

    async def ignore(_conn: object, _message: object) -> None:
        return None

    manager: ConnectionManager[object] = ConnectionManager(
        "data-server", lambda raw: raw, ignore, ConnectionLimits(), domain=b"data-test"
    )
    port = await manager.start("127.0.0.1", 0)
    try:
        await _bomb_after_handshake(port, b"data-test", CONTROL_FRAME_SIZE)
        await _bomb_after_handshake(port, b"data-test", 4 << 20)
        assert manager.protocol_violations == 2
        assert reason_logged(caplog, "exceeds max_array_len")
        assert reason_logged(caplog, f"exceeds the maximum of {CONTROL_FRAME_SIZE} bytes")
    finally:
        await manager.close()


async def test_a_p2p_listener_reads_only_control_frames_in_the_handshake(caplog) -> None:
    caplog.set_level(logging.INFO)
    node = P2PNode(
        Identity.generate(), is_member=lambda _p: True, config=P2PConfig(bind_host="127.0.0.1")
    )
    await node.start()
    try:
        for size in (HANDSHAKE_FRAME_SIZE, 1 << 20):
            reader, writer = await asyncio.open_connection("127.0.0.1", node.port)
            await read_frame(reader, 1 << 16, timeout=5)  # the challenge
            await _write(writer, _bomb(size))
            await assert_closed(reader)
            writer.close()
        await poll_until(lambda: not node.inbound.conns, timeout=5)
        assert reason_logged(caplog, "exceeds max_array_len")
        assert reason_logged(caplog, f"exceeds the maximum of {HANDSHAKE_FRAME_SIZE} bytes")
    finally:
        await node.close()


async def test_a_key_over_its_rate_gets_its_frames_dropped_undecoded(caplog) -> None:
    """The rate limit is checked on a frame's bytes: frames over it are dropped before any
    decode (here: invalid msgpack, which a decode would refuse as a protocol violation), and
    the key is closed for its rate, not for its bytes."""
    caplog.set_level(logging.INFO)
    handled: list[object] = []

    async def record(_conn: object, message: object) -> None:
        handled.append(message)

    def joined(conn: Connection) -> None:
        conn.joined = True  # a member: its frames may be large, decoded without bounds

    limits = ConnectionLimits(messages_per_second=0.01, message_burst=2)
    manager: ConnectionManager[object] = ConnectionManager(
        "coordinator", lambda raw: raw, record, limits, domain=b"rate-test", on_connect=joined
    )
    port = await manager.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        channel = await connect_handshake(
            reader, writer, Identity.generate(), domain=b"rate-test", timeout=5
        )
        writer.write(channel.seal({"type": "Hello"}) + channel.seal({"type": "Hello"}))  # burst
        writer.write(b"".join(channel.seal_payload(b"\xc1") for _ in range(3)))  # never msgpack
        await writer.drain()
        await assert_closed(reader)
        writer.close()
        assert handled == [{"type": "Hello"}] * 2
        assert manager.dropped_messages == 2 and manager.protocol_violations == 1
        assert reason_logged(caplog, "messages/s") and not reason_logged(caplog, "msgpack")
    finally:
        await manager.close()
