"""Limits before authentication on a real server: handshake frames over a few KiB are refused
on the length prefix (coordinator and data-server ports, whatever `--max-frame-size`), and one
IP address may hold only `max_handshakes_per_ip` unauthenticated connections at once, while a
client from elsewhere (here: after the slots free up) still joins."""

from __future__ import annotations

import asyncio
import logging
import struct
from pathlib import Path

from psyche_common.protocol import HANDSHAKE_FRAME_SIZE, read_frame
from psyche_server.connections import ConnectionLimits, ConnectionManager

from tests.support.protocol_client import ProtocolClient
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
