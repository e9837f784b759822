"""`run_metrics.RunMetrics`: per-step medians of witness reports, bounded history, counters;
and the Prometheus text its snapshot becomes (`metrics_export.SnapshotCollector`)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from psyche_server.metrics_export import SnapshotCollector
from psyche_server.run_metrics import MetricsBoard, RunMetrics


def _id(n: int) -> bytes:
    return bytes([n]) * 32


def _snapshot(metrics: RunMetrics, **overrides: object):
    values: dict[str, object] = dict(
        run_id="r",
        step=7,
        epoch=1,
        run_state="RoundTrain",
        members=3,
        pending=4,
        relay_bytes_total=0,
    )
    values.update(overrides)
    return metrics.snapshot(**values)  # type: ignore[arg-type]


def test_median_over_witnesses_bounds_one_liar() -> None:
    metrics = RunMetrics()
    metrics.record_witness(5, _id(1), 2.0, 100.0, 0.0)
    metrics.record_witness(5, _id(2), 2.2, 120.0, 0.0)
    metrics.record_witness(5, _id(3), 1e9, 1e12, 0.0)  # a liar
    summary = metrics.summary(5)
    assert summary is not None
    assert summary.reports == 3
    assert summary.loss == 2.2
    assert summary.tokens_per_sec == 120.0


def test_a_witness_counts_once_per_step() -> None:
    metrics = RunMetrics()
    for loss in (9.0, 9.0, 9.0):
        metrics.record_witness(1, _id(9), loss, 1.0, None)
    metrics.record_witness(1, _id(1), 1.0, 1.0, None)
    metrics.record_witness(1, _id(2), 1.0, 1.0, None)
    summary = metrics.summary(1)
    assert summary is not None and summary.reports == 3 and summary.loss == 1.0


def test_unusable_values_are_ignored() -> None:
    metrics = RunMetrics()
    metrics.record_witness(1, _id(1), math.nan, -5.0, math.inf)
    metrics.record_witness(1, _id(2), 3.0, 10.0, None)
    summary = metrics.summary(1)
    assert summary is not None
    assert (summary.loss, summary.tokens_per_sec, summary.bandwidth_per_sec) == (3.0, 10.0, None)


def test_history_is_bounded_and_ordered() -> None:
    metrics = RunMetrics(history=4)
    for step in (3, 1, 2, 5, 4, 6):
        metrics.record_witness(step, _id(1), float(step), 1.0, None)
    assert [s.step for s in metrics.steps()] == [3, 4, 5, 6]
    metrics.record_witness(0, _id(1), 0.0, 1.0, None)  # older than all kept: dropped
    assert [s.step for s in metrics.steps()] == [3, 4, 5, 6]
    latest = metrics.latest()
    assert latest is not None and latest.step == 6 and latest.loss == 6.0
    with pytest.raises(ValueError, match="history"):
        RunMetrics(history=0)


def test_departures_count_each_client_once_per_epoch() -> None:
    metrics = RunMetrics()
    metrics.observe_departures(1, [_id(1)])
    metrics.observe_departures(1, [_id(1), _id(2)])
    assert metrics.departures_total == 2
    metrics.observe_departures(2, [_id(1)])  # the same client, a new epoch
    assert metrics.departures_total == 3


def test_snapshot_carries_members_and_counters() -> None:
    metrics = RunMetrics()
    metrics.count_convictions(2)
    metrics.count_convictions(0)
    metrics.record_witness(7, _id(1), 4.0, 50.0, None)
    snapshot = _snapshot(metrics, members=3, relay_bytes_total=123)
    assert snapshot.members == 3 and snapshot.pending == 4
    assert snapshot.convictions_total == 2
    assert snapshot.witness_reports_total == 1
    assert snapshot.latest is not None and snapshot.latest.loss == 4.0


def _scrape(board: MetricsBoard) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(board))
    return generate_latest(registry).decode()


def test_prometheus_text_has_psyche_names_and_run_id() -> None:
    metrics = RunMetrics()
    board = MetricsBoard(_snapshot(metrics))
    before = _scrape(board)
    assert "psyche_loss" not in before  # nothing reported yet: absent, not zero
    assert 'psyche_step{run_id="r"} 7.0' in before
    assert 'psyche_members{run_id="r"} 3.0' in before
    metrics.record_witness(7, _id(1), 4.0, 50.0, 0.0)
    metrics.count_convictions(1)
    board.publish(_snapshot(metrics, relay_bytes_total=99))
    text = _scrape(board)
    assert 'psyche_loss{run_id="r"} 4.0' in text
    assert 'psyche_tokens_per_second{run_id="r"} 50.0' in text
    assert 'psyche_convictions_total{run_id="r"} 1.0' in text
    assert 'psyche_relay_bytes_total{run_id="r"} 99.0' in text
    assert 'psyche_epoch{run_id="r"} 1.0' in text
    assert "psyche_bandwidth_bytes_per_second" not in text  # only zero reported


def test_eval_scores_are_medians_per_name_and_exported() -> None:
    metrics = RunMetrics()
    metrics.record_witness(5, _id(1), 4.0, 1.0, 0.0, {"arc_easy": 0.25, "heldout_loss": 3.0})
    metrics.record_witness(5, _id(2), 4.0, 1.0, 0.0, {"arc_easy": 0.5})
    metrics.record_witness(5, _id(3), 4.0, 1.0, 0.0, {"arc_easy": 0.9, "bad": math.nan})
    metrics.record_witness(6, _id(1), 4.0, 1.0, 0.0, {"heldout_loss": 2.0})
    summary = metrics.summary(5)
    assert summary is not None
    assert summary.evals == {"arc_easy": 0.5, "heldout_loss": 3.0}  # NaN ignored
    assert metrics.latest_evals() == {"arc_easy": (5, 0.5), "heldout_loss": (6, 2.0)}
    text = _scrape(MetricsBoard(_snapshot(metrics)))
    assert 'psyche_eval{eval="arc_easy",run_id="r"} 0.5' in text
    assert 'psyche_eval{eval="heldout_loss",run_id="r"} 2.0' in text
    assert 'psyche_eval_step{eval="heldout_loss",run_id="r"} 6.0' in text


def test_no_eval_gauges_before_any_score() -> None:
    assert "psyche_eval" not in _scrape(MetricsBoard(_snapshot(RunMetrics())))
