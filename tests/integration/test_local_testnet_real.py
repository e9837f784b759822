"""The local testnet with the real psyche-server and psyche-client (slow: trains on the CPU).

A 6-step run of the embedded default model with two clients must finish, advance and keep the
clients' weights identical.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from psyche_local_testnet.default_config import render_default_state

from bench.support.ports import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

TESTNET = Path(sys.executable).parent / "psyche-local-testnet"


def test_real_two_client_run_finishes_with_identical_weights(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "state.toml").write_text(render_default_state(2, None, total_steps=6))
    argv = [
        str(TESTNET),
        "start",
        "--headless",
        "--num-clients",
        "2",
        "--duration",
        "400",
        "--config-path",
        str(config),
        "--run-dir",
        str(tmp_path / "run"),
        "--server-port",
        str(free_port()),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("summary: "), result.stdout + result.stderr
    summary = json.loads(last.removeprefix("summary: "))
    assert result.returncode == 0, result.stdout + result.stderr
    assert summary["ok"] and summary["finished"] and summary["hashes_agree"]
    assert summary["last_step"] >= 5
    assert summary["loss_end"] < summary["loss_start"]
