"""Weights-hash majority bookkeeping and the saved-state file (pure parts of the server)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from psyche_common.config import load_state
from psyche_common.coordinator import Client, ClientState, RunState
from psyche_server.consistency import WeightsHashTracker
from psyche_server.persistence import save_state, saved_state_name

from tests.support.server_harness import load_coordinator, write_state

A, B, C, D = (bytes([i]) * 32 for i in range(4))
H1, H2 = b"\x11" * 32, b"\x22" * 32


def test_majority_and_outliers() -> None:
    tracker = WeightsHashTracker(max_steps=2)
    assert tracker.latest() is None
    assert tracker.record(5, A, H1).divergent == frozenset()
    tie = tracker.record(5, B, H2)
    assert tie.majority is None and tie.divergent == frozenset()  # 1 vs 1: nobody to blame
    verdict = tracker.record(5, C, H1)
    assert verdict.majority == H1 and verdict.divergent == {B} and verdict.reports == 3
    tracker.record(5, B, H1)  # a later report from the same client replaces the earlier one
    assert tracker.verdict(5).divergent == frozenset()
    tracker.record(6, D, H2)
    tracker.record(7, D, H2)
    assert 5 not in tracker.reports  # only the last max_steps steps are kept
    assert tracker.latest() is not None and tracker.latest().step == 7


def test_saved_state_resumes_progress_and_remembers_the_members(tmp_path: Path) -> None:
    coordinator = load_coordinator(
        write_state(tmp_path / "s.toml", run_id="run/x", init_min_clients=1)
    )
    coordinator.epoch_state.clients = [Client(A), Client(B, ClientState.Withdrawn)]
    coordinator.epoch_state.exited_clients = [Client(C, ClientState.Dropped)]
    coordinator.progress.step = 9
    coordinator.progress.epoch = 2
    coordinator.progress.epoch_start_data_index = 77
    path = save_state(coordinator, tmp_path / "saved")
    assert path.name == saved_state_name("run/x", 8) == "run_x-step8.toml"
    assert len(coordinator.epoch_state.exited_clients) == 1  # the live coordinator is untouched
    saved = load_state(path)
    assert saved.epoch_state is not None
    # A holds the model; the withdrawn B and the dropped C are forgotten
    assert [c["id"] for c in saved.epoch_state["clients"]] == [A.hex()]
    assert saved.epoch_state["exited_clients"] == []
    assert saved.run_id == "run/x"
    assert (saved.progress.epoch, saved.progress.step, saved.progress.epoch_start_data_index) == (
        2,
        9,
        77,
    )
    assert saved.run_state is RunState.WaitingForMembers
    assert tomllib.loads(path.read_text())["run_state"] == "WaitingForMembers"
    assert not list((tmp_path / "saved").glob(".*"))  # no temporary file left behind


def test_monitor_logs_each_outlier_once(caplog) -> None:
    from psyche_server.consistency import WeightsHashMonitor

    caplog.set_level("WARNING")
    monitor = WeightsHashMonitor(WeightsHashTracker(max_steps=3))
    for client in (A, B):
        monitor.record(1, client, H1)
    monitor.record(1, C, H2)
    monitor.record(1, D, H1)  # C is still the outlier: not logged again
    flagged = [r for r in caplog.records if getattr(r, "event", "") == "weights_divergence"]
    assert [r.client for r in flagged] == [C[:4].hex()]
    assert monitor.divergent_clients() == {C}
