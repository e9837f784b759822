"""Weights-hash majority bookkeeping and the saved-state file (pure parts of the server)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from psyche_common.config import load_state
from psyche_common.coordinator import Client, ClientState, RunState
from psyche_server.consistency import FUTURE_STEPS, WeightsHashTracker
from psyche_server.persistence import save_state, saved_state_name

from tests.support.server_harness import load_coordinator, write_state

A, B, C, D = (bytes([i]) * 32 for i in range(4))
H1, H2 = b"\x11" * 32, b"\x22" * 32


def _tracker(members: tuple[bytes, ...] = (A, B, C), window: int = 4) -> WeightsHashTracker:
    tracker = WeightsHashTracker(window=window)
    tracker.set_members(members)
    tracker.advance(5)
    return tracker


def test_majority_of_the_members_and_outliers() -> None:
    tracker = _tracker()
    assert tracker.latest() is None
    assert tracker.record(5, A, H1) == []
    assert tracker.record(5, B, H2) == []
    assert tracker.verdict(5).majority is None  # 1 vs 1 of 3 members: nobody to blame
    assert tracker.record(5, C, H1) == [B]  # 2 of 3 members: a majority
    verdict = tracker.verdict(5)
    assert verdict.majority == H1 and verdict.divergent == {B} and verdict.reports == 3
    tracker.record(5, B, H1)  # a later report from the same client replaces the earlier one
    assert tracker.verdict(5).divergent == frozenset()


def test_a_tie_of_the_members_flags_nobody() -> None:
    tracker = _tracker((A, B, C, D))
    for client, digest in ((A, H1), (B, H1), (C, H2), (D, H2)):
        assert tracker.record(5, client, digest) == []
    assert tracker.verdict(5).majority is None and tracker.divergent_clients() == frozenset()


def test_reports_of_keys_that_are_no_members_are_ignored() -> None:
    """Finding 1: keys that never joined outnumber the members with a forged hash."""
    tracker = _tracker()
    for client in (A, B, C):
        tracker.record(5, client, H1)
    forgers = [bytes([0x80 + i]) * 32 for i in range(5)]
    for forger in forgers:
        assert tracker.record(5, forger, H2) == []
    verdict = tracker.verdict(5)
    assert verdict.majority == H1 and verdict.divergent == frozenset() and verdict.reports == 3
    # a minority of the members cannot name a majority either
    assert tracker.record(6, A, H2) == [] and tracker.verdict(6).majority is None


def test_only_a_window_of_recent_steps_is_judged() -> None:
    tracker = _tracker(window=4)
    tracker.record(5, A, H1)
    tracker.advance(9)
    assert 5 not in tracker.reports  # fell out of the window
    assert tracker.record(5, B, H1) == [] and tracker.size() == 0  # too old: ignored
    assert tracker.record(1_000_000, A, H1) == [] and tracker.size() == 0  # far future: ignored
    tracker.record(9 + FUTURE_STEPS, A, H1)
    assert tracker.size() == 1


def test_a_member_that_leaves_takes_its_reports() -> None:
    tracker = _tracker()
    tracker.record(5, A, H1)
    tracker.record(5, B, H1)
    assert tracker.record(5, C, H2) == [C]
    tracker.forget(A)
    assert A not in tracker.reports[5] and A not in tracker.members
    # B and C of 2 members: 1 vs 1, no majority any more, nobody flagged
    assert tracker.verdict(5).majority is None and tracker.divergent_clients() == frozenset()
    assert tracker.record(6, A, H1) == []  # no longer counted
    # a new member list (the next epoch) drops everyone else's reports too
    tracker.set_members([D])
    assert tracker.size() == 0


def test_a_smaller_member_list_can_make_a_majority() -> None:
    tracker = _tracker((A, B, C, D))
    tracker.record(5, A, H1)
    tracker.record(5, B, H1)
    tracker.record(5, C, H2)
    assert tracker.verdict(5).majority is None  # 2 of 4 is no majority
    assert tracker.forget(D) == [(5, C)]  # 2 of 3 is


def test_memory_stays_bounded_under_many_steps_and_keys() -> None:
    members = tuple(bytes([i]) * 32 for i in range(8))
    tracker = _tracker(members, window=4)
    for step in range(5, 2_000):
        tracker.advance(step)
        for client in members:
            tracker.record(step, client, H1)
        tracker.record(step, b"\xee" * 32, H2)  # a stranger, every step
    assert tracker.size() <= (4 + FUTURE_STEPS) * len(members)
    assert len(tracker.reports) <= 4 + FUTURE_STEPS


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
    assert [c.id for c in saved.epoch_state.clients] == [A]
    assert saved.epoch_state.exited_clients == []
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
    monitor = WeightsHashMonitor(WeightsHashTracker(window=3))
    monitor.set_members([A, B, C, D])
    monitor.advance(1)
    for client in (A, B):
        monitor.record(1, client, H1)
    monitor.record(1, C, H2)
    monitor.record(1, D, H1)  # C is still the outlier: not logged again
    flagged = [r for r in caplog.records if getattr(r, "event", "") == "weights_divergence"]
    assert [r.client for r in flagged] == [C[:4].hex()]
    assert monitor.divergent_clients() == {C}
