"""`StateSaver`: the latest state file follows the resume point, is never written in Warmup,
keeps the state file's warmup time, and a failed write is logged without stopping the server."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from psyche_common.config import load_state
from psyche_common.coordinator import Coordinator, RunState
from psyche_server.persistence import StateSaver, latest_state_name

from tests.support.server_harness import load_coordinator, write_state

A, B = (bytes([i]) * 32 for i in range(2))


def coordinator(tmp_path: Path) -> Coordinator:
    return load_coordinator(
        write_state(
            tmp_path / "s.toml", run_id="run-s", init_min_clients=2, warmup_time=5, epoch_time=60
        )
    )


def test_writes_when_the_resume_point_changes_and_skips_warmup(tmp_path: Path) -> None:
    coord = coordinator(tmp_path)
    saver = StateSaver(tmp_path / "saved", warmup_time=5)
    path = saver.update(coord)
    assert path == tmp_path / "saved" / latest_state_name("run-s") == saver.last_path
    assert saver.update(coord) is None  # nothing changed: no write
    path.unlink()

    coord.run_state_start_unix_timestamp = 0
    coord.tick([A, B], 1000, 1)
    assert coord.run_state == RunState.Warmup
    assert saver.update(coord) is None and not path.exists()  # Warmup keeps the earlier point
    assert saver.save_now(coord) == path and not path.exists()  # ...even on shutdown

    coord.tick([A, B], 1005, 1)
    assert coord.run_state == RunState.RoundTrain
    assert saver.update(coord) == path
    saved = load_state(path)
    assert saved.run_state is RunState.WaitingForMembers
    assert saved.progress.step == coord.progress.step
    assert saved.epoch_state is not None and len(saved.epoch_state.clients) == 2


def test_the_state_files_warmup_time_is_saved_not_the_live_one(tmp_path: Path) -> None:
    coord = coordinator(tmp_path)
    coord.config.warmup_time = 1  # what --init-warmup-time does to the live coordinator
    saver = StateSaver(tmp_path / "saved", warmup_time=5)
    path = saver.save_now(coord)
    assert path is not None and load_state(path).config.warmup_time == 5
    assert coord.config.warmup_time == 1


def test_a_failed_write_is_logged_and_retried_at_the_next_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    blocker = tmp_path / "saved"
    blocker.write_text("a file where the save directory should be")
    coord = coordinator(tmp_path)
    saver = StateSaver(blocker, warmup_time=5)
    assert saver.update(coord) is None
    assert saver.save_now(coord) is None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and str(blocker) in errors[0].getMessage()
    blocker.unlink()
    coord.progress.step += 1
    assert saver.update(coord) == blocker / latest_state_name("run-s")
