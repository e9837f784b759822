"""`psyche-local-testnet start --first-client-checkpoint REPO`, end to end with the real
psyche-server and psyche-client (dummy training, so no torch work) and a stand-in Hub.

Client 1 saves a checkpoint at the first epoch's end, uploads it and reports it to the server
(during the second epoch: the upload takes the client seconds); the server must accept the
report (the testnet names client 1 with `--checkpointer`), so the run's saved state names the
uploaded repo and revision.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bench.harness.client_run import free_port, write_state
from tests.support.fake_hub import FakeHub

pytestmark = [
    pytest.mark.slow,  # about a minute: two epochs, and the upload waits for torch to import
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

TESTNET = Path(sys.executable).parent / "psyche-local-testnet"
REPO = "testnet-owner/checkpoints"
RUN_ID = "ckpt-run"


def saved_checkpoint(path: Path) -> dict[str, str]:
    """The `[model.LLM.checkpoint.*]` table of a state file the server saved."""
    checkpoint = tomllib.loads(path.read_text())["model"]["LLM"]["checkpoint"]
    ((_kind, fields),) = checkpoint.items()
    return dict(fields)


def test_the_first_clients_uploads_become_the_runs_checkpoint(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    write_state(
        config / "state.toml",
        run_id=RUN_ID,
        warmup_time=5,
        epoch_time=10,  # the first epoch ends after a few steps, the run in the second
        cooldown_time=3,
        max_round_train_time=5,
        total_steps=20,
        init_min_clients=2,
        min_clients=2,
    )
    run_dir = tmp_path / "run"
    with FakeHub() as hub:
        env = {
            **os.environ,
            "HF_ENDPOINT": hub.endpoint,
            "HF_TOKEN": "hf_not_a_real_token",
            "DUMMY_TRAINING_DELAY_SECS": "0.2",  # every client: `train`'s flags read the env
        }
        argv = [
            str(TESTNET),
            "start",
            "--headless",
            "--num-clients",
            "2",
            "--duration",
            "200",
            "--config-path",
            str(config),
            "--run-dir",
            str(run_dir),
            "--server-port",
            str(free_port()),
            "--first-client-checkpoint",
            REPO,
        ]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=280, check=False, env=env
        )
        commits = list(hub.commits)
    output = result.stdout + result.stderr
    logs = run_dir / "logs"
    server_log = (logs / "server.log").read_text() if (logs / "server.log").exists() else ""
    diagnostics = f"{output}\n--- server.log\n{server_log[-4000:]}"
    last = (result.stdout.strip().splitlines() or [""])[-1]
    assert last.startswith("summary: "), diagnostics
    summary = json.loads(last.removeprefix("summary: "))
    assert result.returncode == 0 and summary["finished"], diagnostics

    assert commits, f"client 1 uploaded nothing\n{diagnostics}"
    assert {c.repo_id for c in commits} == {REPO}
    assert all("dummy.weights" in c.files for c in commits), [c.files.keys() for c in commits]
    saved = sorted((run_dir / "checkpoints").glob(f"{RUN_ID}-step*"))
    assert saved, "client 1 saved no checkpoint"

    assert "NotCheckpointer" not in server_log and "ignored" not in server_log, diagnostics
    latest = saved_checkpoint(run_dir / "saved-states" / f"{RUN_ID}-latest.toml")
    assert latest == {"repo_id": REPO, "revision": commits[-1].oid}, diagnostics
