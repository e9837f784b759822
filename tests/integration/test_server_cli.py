"""`psyche-server run` as a subprocess: the listening line, JSON logs, clean SIGTERM/SIGINT,
save at epoch end → kill → restart from the saved file → the run resumes where it was."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from psyche_common.config import load_state
from psyche_common.coordinator import RunState

from bench.harness.protocol_client import ProtocolClient, start_clients
from tests.support.server_harness import poll_until, write_state

LISTENING = re.compile(r"psyche-server listening on ([0-9.]+):(\d+)")


class ServerProcess:
    def __init__(self, process: asyncio.subprocess.Process, port: int, stderr_path: Path) -> None:
        self.process = process
        self.port = port
        self.stderr_path = stderr_path

    async def stop(self, signum: int = signal.SIGTERM, timeout: float = 10) -> int:
        self.process.send_signal(signum)
        return await asyncio.wait_for(self.process.wait(), timeout)


async def start_server(tmp_path: Path, *args: str, name: str = "server") -> ServerProcess:
    stderr_path = tmp_path / f"{name}.stderr"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "psyche_server",
        "run",
        "--no-tui",
        "--tick-interval",
        "0.1",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr_path.open("wb"),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 30)
    match = LISTENING.search(line.decode())
    if match is None:
        await process.wait()
        raise AssertionError(f"no listening line: {line!r}; stderr: {stderr_path.read_text()}")
    return ServerProcess(process, int(match.group(2)), stderr_path)


async def failed_start_stderr(*args: str) -> bytes:
    """Run `psyche-server run --no-tui ARGS`, expect exit status 1, return its stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "psyche_server",
        "run",
        "--no-tui",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 1
    return stderr


async def test_missing_data_config_exits_with_clear_error(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", data_location={"Server": "127.0.0.1:0"})
    stderr = await failed_start_stderr("--state", str(state))
    assert b"no --data-config passed" in stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_listening_line_json_logs_and_clean_shutdown(tmp_path: Path, signum: int) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2)
    server = await start_server(tmp_path, "--state", str(state), "--log-format", "json")
    run_id = load_state(state).run_id
    client = await ProtocolClient(server.port, run_id, auto=False).connect()
    await client.wait_for(lambda c: c.run_state == RunState.WaitingForMembers, timeout=10)
    assert await server.stop(signum) == 0
    await client.wait_closed()
    lines = [json.loads(line) for line in server.stderr_path.read_text().splitlines() if line]
    assert any(entry["msg"].startswith("coordinator listening") for entry in lines)
    joined = [e for e in lines if e["msg"].startswith(client.short_id + " joined")]
    assert joined and joined[0]["client"] == client.short_id
    assert lines[-1]["msg"] == "server stopped"


async def test_save_kill_restart_resumes(tmp_path: Path) -> None:
    save_dir = tmp_path / "saved"
    state = write_state(
        tmp_path / "s.toml",
        init_min_clients=2,
        global_batch_size=2,
        epoch_time=3,
        warmup_time=1,
        max_round_train_time=2,
    )
    run_id = load_state(state).run_id
    server = await start_server(tmp_path, "--state", str(state), "--save-state-dir", str(save_dir))
    clients = await start_clients(2, server.port, run_id)
    await clients[0].wait_for(lambda c: c.progress.epoch == 1, timeout=40)
    saved = await poll_until(lambda: sorted(save_dir.glob("*-step*.toml")), timeout=10)
    assert await server.stop(signal.SIGKILL) == -signal.SIGKILL  # a crash, not a shutdown
    for c in clients:
        await c.close()

    saved_state = load_state(saved[0])
    assert saved_state.progress.epoch == 1
    assert saved_state.progress.step >= 3
    assert saved[0].name == f"{run_id}-step{saved_state.progress.step - 1}.toml"
    assert saved_state.run_state is RunState.WaitingForMembers

    restarted = await start_server(tmp_path, "--state", str(saved[0]), name="restarted")
    clients = await start_clients(2, restarted.port, run_id)
    first = await clients[0].wait_for(lambda c: c.run_state == RunState.Warmup, timeout=20)
    assert first.progress.epoch == 1
    assert first.progress.step == saved_state.progress.step
    assert first.progress.epoch_start_data_index == saved_state.progress.epoch_start_data_index
    # new identities: nobody from before the restart can serve the model, P2P fell back to Hub
    assert first.model.checkpoint.kind == "Hub"
    await clients[0].wait_for(lambda c: c.progress.epoch == 2, timeout=40)
    assert await restarted.stop() == 0
    for c in clients:
        await c.close()


async def test_port_in_use_exits_with_clear_error(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml")
    blocker = await asyncio.start_server(lambda r, w: None, "0.0.0.0", 0)
    port = blocker.sockets[0].getsockname()[1]
    try:
        stderr = await failed_start_stderr("--state", str(state), "--server-port", str(port))
        assert f"cannot listen on 0.0.0.0:{port}".encode() in stderr
    finally:
        blocker.close()


async def test_relay_port_in_use_names_the_flags_to_change(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml")
    blocker = await asyncio.start_server(lambda r, w: None, "0.0.0.0", 0)
    relay_port = blocker.sockets[0].getsockname()[1]
    try:
        stderr = await failed_start_stderr("--state", str(state), "--relay-port", str(relay_port))
        assert f"cannot bind the relay port {relay_port}".encode() in stderr
        assert b"leave it out to share the coordinator port, or --no-relay" in stderr
    finally:
        blocker.close()


async def test_metrics_port_in_use_exits_with_clear_error(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml")
    blocker = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = blocker.sockets[0].getsockname()[1]
    try:
        stderr = await failed_start_stderr("--state", str(state), "--metrics-port", str(port))
        assert f"cannot serve metrics on 127.0.0.1:{port}".encode() in stderr
    finally:
        blocker.close()


async def test_metrics_port_zero_prints_the_endpoint(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml")
    server = await start_server(tmp_path, "--state", str(state), "--metrics-port", "0")
    try:
        assert server.process.stdout is not None
        found = None
        while found is None:  # after the relay line
            line = (await asyncio.wait_for(server.process.stdout.readline(), 10)).decode()
            assert line, "no metrics line"
            found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
        reader, writer = await asyncio.open_connection("127.0.0.1", int(found.group(1)))
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        body = (await asyncio.wait_for(reader.read(), 10)).decode()
        writer.close()
        assert "psyche_members{run_id=" in body
    finally:
        assert await server.stop() == 0
