"""The client's metrics: one step's figures (`StepFigures`), the reporter that emits each
finished step with the optimizer statistics and extras, and the wandb sink's promises (it
never raises nor blocks; online without credentials it refuses to start)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

import pytest
from psyche_client.metrics.reporter import StepReporter
from psyche_client.metrics.sink import MetricsStartError
from psyche_client.metrics.step_values import StepFigures
from psyche_client.metrics.wandb_sink import WandbSink
from psyche_client.p2p.stats import TransferStats
from psyche_client.round.stats import ClientStats
from psyche_common.coordinator import RunState

from tests.support.coordinators import coordinator_in, ids


class RecordingSink:
    def __init__(self) -> None:
        self.entries: list[tuple[int, dict[str, float]]] = []

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.entries.append((step, dict(values)))

    def close(self) -> None:
        pass


def figures(**changes: object) -> StepFigures:
    base: dict[str, object] = {
        "step": 5,
        "epoch": 1,
        "num_clients": 3,
        "lr": 1e-3,
        "loss": 2.5,
        "tokens_per_sec": 100.0,
        "efficiency": 0.5,
        "total_tokens": 640,
        "applied_results": 3,
        "bytes_up": 1000,
        "bytes_down": 3000,
        "seconds": 2.0,
    }
    base.update(changes)
    return StepFigures(**base)  # type: ignore[arg-type]


def test_step_figures_name_every_value() -> None:
    assert figures().values() == {
        "train/loss": 2.5,
        "train/lr": 1e-3,
        "train/tokens_per_sec": 100.0,
        "train/efficiency": 0.5,
        "train/total_tokens": 640.0,
        "train/applied_results": 3.0,
        "p2p/bytes_up": 1000.0,
        "p2p/bytes_down": 3000.0,
        "p2p/bytes_up_per_sec": 500.0,
        "p2p/bytes_down_per_sec": 1500.0,
        "round/seconds": 2.0,
        "coordinator/epoch": 1.0,
        "coordinator/num_clients": 3.0,
    }


def test_step_figures_leave_out_what_is_unknown_or_not_finite() -> None:
    values = figures(loss=None, applied_results=None, seconds=None, lr=float("nan")).values()
    assert not {"train/loss", "train/applied_results", "train/lr"} & set(values)
    assert "p2p/bytes_up_per_sec" not in values and "round/seconds" not in values


def test_reporter_emits_each_step_once_the_coordinator_moved_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clients = ids(2)
    sink = RecordingSink()
    stats = ClientStats()
    traffic = TransferStats()
    optim: list[tuple[int, dict[str, float]]] = []
    now = [100.0]
    reporter = StepReporter(
        sink, stats, traffic, lambda: [optim.pop()] if optim else [], clock=lambda: now[0]
    )

    train3 = coordinator_in(RunState.RoundTrain, clients, step=3, height=2)
    reporter.observe(train3)
    traffic.set_step(3)
    traffic.record_sent(None, 400)
    traffic.record_received(None, 1200)
    stats.losses.append((3, 4.25))
    stats.results_applied(3, 2)
    reporter.observe(coordinator_in(RunState.RoundWitness, clients, step=3, height=2))
    assert sink.entries == []  # step 3 is still open
    now[0] = 104.0
    optim.append((2, {"w.grad_energy": 1.5, "w.captured_energy": 0.25}))
    with caplog.at_level(logging.INFO, logger="psyche.client"):
        reporter.observe(coordinator_in(RunState.RoundTrain, clients, step=4, height=3))
    step3 = dict(sink.entries)[3]
    assert step3["train/loss"] == 4.25
    assert step3["train/applied_results"] == 2.0
    assert step3["p2p/bytes_up"] == 400.0 and step3["p2p/bytes_down"] == 1200.0
    assert step3["p2p/bytes_down_per_sec"] == 300.0
    assert step3["train/lr"] > 0
    assert step3["coordinator/num_clients"] == 2.0
    assert dict(sink.entries)[2] == {"optim/w.grad_energy": 1.5, "optim/w.captured_energy": 0.25}
    logged = [r for r in caplog.records if r.getMessage() == "optimizer statistics"]
    assert logged and logged[0].__dict__["mean_captured_energy"] == 0.25
    assert any(r.getMessage() == "step metrics" for r in caplog.records)

    # step 4 trained nothing here; the epoch's Cooldown finishes it
    reporter.observe(coordinator_in(RunState.Cooldown, clients, step=5, height=4))
    step4 = dict(sink.entries)[4]
    assert "train/loss" not in step4 and "train/applied_results" not in step4
    reporter.observe(coordinator_in(RunState.Cooldown, clients, step=5, height=4))
    assert [step for step, _ in sink.entries] == [3, 2, 4]


def test_reporter_extras_keep_only_finite_values() -> None:
    sink = RecordingSink()
    reporter = StepReporter(sink, ClientStats(), TransferStats())
    reporter.extra(7, {"eval/arc_easy": 0.5, "eval/broken": float("nan")})
    reporter.extra(8, {"eval/broken": float("inf")})
    assert sink.entries == [(7, {"eval/arc_easy": 0.5})]


class FailingRun:
    def __init__(self) -> None:
        self.calls = 0
        self.finished = False

    def log(self, data: Mapping[str, float]) -> None:
        self.calls += 1
        raise RuntimeError("wandb backend went away")

    def finish(self) -> None:
        self.finished = True
        raise RuntimeError("cannot finish either")


def test_wandb_errors_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    run = FailingRun()
    sink = WandbSink(run)
    with caplog.at_level(logging.WARNING, logger="psyche.client"):
        for step in range(3):
            sink.log(step, {"train/loss": 1.0})
        sink.close()
    assert run.calls == 3 and run.finished
    assert sink.errors == 3
    assert "wandb backend went away" in caplog.text
    assert "finishing the run failed" in caplog.text
    sink.log(4, {"train/loss": 1.0})  # after close: ignored, no error


class StuckRun:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.logged: list[dict[str, float]] = []

    def log(self, data: Mapping[str, float]) -> None:
        self.release.wait(10)
        self.logged.append(dict(data))

    def finish(self) -> None:
        pass


def test_a_stuck_wandb_never_blocks_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    run = StuckRun()
    sink = WandbSink(run, queue_size=2)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="psyche.client"):
        for step in range(10):
            sink.log(step, {"train/loss": float(step)})
    assert time.monotonic() - started < 1.0
    assert sink.dropped >= 7
    assert "too slow" in caplog.text
    run.release.set()
    sink.close()
    assert run.logged[0] == {"step": 0, "train/loss": 0.0}


def test_online_wandb_without_credentials_refuses_to_start(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from psyche_client.metrics.options import MetricsOptions

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_IDENTITY_TOKEN_FILE", raising=False)
    with pytest.raises(MetricsStartError, match="WANDB_API_KEY"):
        WandbSink.open(MetricsOptions(wandb_project="p"), "run", "abcd")
