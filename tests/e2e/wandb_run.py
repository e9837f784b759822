"""Helpers of the e2e runs that log to wandb offline (`--wandb-project`,
`--optim-stats-steps`): the flags, wandb's environment, and `assert_offline_wandb_runs`, which
reads each client's offline run back with wandb's protobuf schema (tests/support/wandb_offline.py)
and checks it holds, named and grouped as the flags say, per step the loss the client logged,
the learning rate, tokens/s, P2P bytes up and down and the results applied, and at every second
step the per-parameter DisTrO statistics."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.client_run import Proc, losses
from tests.support.wandb_offline import read_run


def wandb_env(monkeypatch: pytest.MonkeyPatch, home: Path, mode: str) -> None:
    """wandb's files under `home`, in `mode`, with no credentials."""
    for name in ("HOME", "WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(home))
    monkeypatch.setenv("WANDB_MODE", mode)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


WANDB_FLAGS = ("--wandb-project", "e2e", "--wandb-group", "pair", "--optim-stats-steps", "2")
"""The flags of a run whose clients `assert_offline_wandb_runs` checks."""


def assert_offline_wandb_runs(clients: list[Proc], home: Path) -> None:
    """Each client (started with `WANDB_FLAGS`, `wandb_env(..., "offline")`) wrote an
    offline run under `home` holding its figures of every step and the optimizer statistics
    of every second step."""
    run_dirs = sorted((home / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == len(clients), list(home.rglob("*"))
    for proc in clients:
        (started,) = proc.events("wandb run started")
        assert Path(started["wandb_dir"]) in run_dirs  # the log line names the run's folder
        run = read_run(Path(started["wandb_dir"]))
        assert run.name == started["wandb_run"] and run.name.startswith("e2e-run-")
        assert (run.project, run.group) == ("e2e", "pair")
        logged_losses = losses(proc)
        rows = run.rows_with("train/loss")
        assert len(rows) >= 3, run.history
        for row in rows:
            assert row["train/loss"] == pytest.approx(logged_losses[row["step"]])
            assert row["train/lr"] == pytest.approx(3.0e-3)
        steps = run.rows_with("train/tokens_per_sec")
        assert any(row["train/tokens_per_sec"] > 0 for row in steps)
        assert any(row["p2p/bytes_up"] > 0 and row["p2p/bytes_down"] > 0 for row in steps)
        assert any(row.get("train/applied_results", 0) == len(clients) for row in steps)
        optim = [row for row in run.history if any(k.startswith("optim/") for k in row)]
        assert optim and all(row["step"] % 2 == 0 for row in optim)
        keys = {key.rsplit(".", 1)[-1] for row in optim for key in row if key.startswith("optim/")}
        assert keys == {"grad_energy", "delta_energy", "captured_energy", "index_overlap"}
        captured = [v for row in optim for k, v in row.items() if k.endswith(".captured_energy")]
        assert all(0 < value <= 1 for value in captured)
        assert proc.events("optimizer statistics")
