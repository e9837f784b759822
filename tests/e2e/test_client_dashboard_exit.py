"""`psyche-client train` on a terminal opens its dashboard by default; when the client fails
at start the reason is printed on the terminal after the dashboard closed, not lost with it.
On a pipe the same command logs console lines instead (no dashboard)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time

import pytest

from bench.harness.client_run import BIN, free_port

pytestmark = pytest.mark.timeout(120)

LEAVE_ALTERNATE_SCREEN = b"\x1b[?1049l"
"""What a closing full-screen dashboard writes last."""


def _train_args(port: int) -> list[str]:
    return [
        str(BIN / "psyche-client"),
        "train",
        "--server-addr",
        f"127.0.0.1:{port}",
        "--run-id",
        "r",
        "--dummy-training-delay-secs",
        "0.1",
    ]


def test_a_start_up_failure_is_printed_after_the_dashboard_closes() -> None:
    port = free_port()  # nothing listens there: the first connection is refused
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    process = subprocess.Popen(_train_args(port), stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    output = b""
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            elif process.poll() is not None:
                break
        assert process.wait(10) == 1
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    assert LEAVE_ALTERNATE_SCREEN in output, "no dashboard was opened on the terminal"
    after = output.rsplit(LEAVE_ALTERNATE_SCREEN, 1)[1].decode(errors="replace")
    assert f"cannot connect to server 127.0.0.1:{port}" in after, after


def test_on_a_pipe_the_client_logs_console_lines() -> None:
    port = free_port()
    result = subprocess.run(
        _train_args(port), capture_output=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 1
    output = (result.stdout + result.stderr).decode(errors="replace")
    assert LEAVE_ALTERNATE_SCREEN.decode() not in output
    assert f"ERROR psyche.client: cannot connect to server 127.0.0.1:{port}" in output, output
