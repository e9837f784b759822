"""`--wandb-project` on a real client process: online without credentials it stops at start,
saying what to do. (The offline runs of real training are checked in the two-client bf16 run of
test_client_e2e.py, `wandb_run.assert_offline_wandb_runs`: one real run serves both.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bench.harness.client_run import no_server_train
from tests.e2e.wandb_run import wandb_env

pytestmark = pytest.mark.timeout(240)


def test_online_wandb_without_credentials_stops_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb_env(monkeypatch, tmp_path, "online")
    log = tmp_path / "client.log"
    result = subprocess.run(
        no_server_train("--logs", "json", "--wandb-project", "e2e"),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
        timeout=120,
    )
    text = log.read_text()
    assert result.returncode == 1, text
    assert "WANDB_API_KEY" in text and "WANDB_MODE=offline" in text
    assert "connect" not in text.lower(), "the client went on after wandb refused to start"
