"""What the server measures about a run, per step (pure: no I/O, no clock, no threads).

`RunMetrics` keeps, for the last `history` steps (512 by default), what the witnesses whose
`Witness` the coordinator accepted reported about their own training (loss, tokens/s,
bandwidth); each step's value is the **median** over those witnesses, so a single lying
witness among three or more moves it no further than the honest values around it (with one or
two witnesses a liar is half the sample: the median is then only as good as the witnesses).
A witness counts once per step (its latest report replaces an earlier one), non-finite or
negative values are ignored, and the step a report counts for is the server's own step when the
coordinator accepted it, not the one the client claims. A witness's report also carries its
latest eval scores (`--eval-tasks`, the held-out loss); each step keeps, per eval name, the median
over the witnesses that reported it, and `latest_evals` the newest such median of each name.

It also counts what only the server sees: clients that left an epoch (dropped, ejected or
withdrawn; each client once per epoch) and convictions. `snapshot` folds these and the
coordinator's figures passed in (step, epoch, members, relay bytes) into one immutable
`MetricsSnapshot`, the one thing the exporters (`metrics_export`) and the dashboard read.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

DEFAULT_HISTORY = 512
"""Steps of per-step figures kept (older steps are forgotten)."""

MAX_REPORTS_PER_STEP = 1024
"""Witness reports kept for one step (the coordinator accepts far fewer witnesses)."""


@dataclass(frozen=True)
class WitnessReport:
    """What one witness said about its own training at one step (None: not reported)."""

    loss: float | None
    tokens_per_sec: float | None
    bandwidth_per_sec: float | None
    evals: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StepSummary:
    """One step's figures: the median over its witnesses of each reported value."""

    step: int
    reports: int
    loss: float | None
    tokens_per_sec: float | None
    bandwidth_per_sec: float | None
    evals: Mapping[str, float] = field(default_factory=dict)
    """Per eval name, the median over the witnesses that reported it at this step."""


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything exported at one instant (immutable: safe to hand to exporter threads)."""

    run_id: str
    step: int
    epoch: int
    run_state: str
    members: int
    pending: int
    latest: StepSummary | None
    """The most recent step with a reported loss or throughput."""
    witness_reports_total: int
    convictions_total: int
    departures_total: int
    relay_bytes_total: int
    evals: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    """Per eval name, (step, median over that step's witnesses) of the newest step reporting it."""


def _usable(value: float | None) -> float | None:
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _eval_medians(reports: Iterable[WitnessReport]) -> dict[str, float]:
    by_name: dict[str, list[float]] = {}
    for report in reports:
        for name, value in report.evals.items():
            by_name.setdefault(name, []).append(value)
    return {name: statistics.median(values) for name, values in sorted(by_name.items())}


class RunMetrics:
    """Per-step medians of witness reports (bounded) and the server's own counters."""

    def __init__(self, history: int = DEFAULT_HISTORY) -> None:
        if history < 1:
            raise ValueError(f"metrics history must be at least 1 step, got {history}")
        self.history = history
        self._steps: OrderedDict[int, dict[bytes, WitnessReport]] = OrderedDict()
        self._departed: set[tuple[int, bytes]] = set()
        self._departed_epoch: int | None = None
        self.witness_reports_total = 0
        self.convictions_total = 0
        self.departures_total = 0

    # ------------------------------------------------------------------ recording

    def record_witness(
        self,
        step: int,
        client_id: bytes,
        loss: float | None,
        tokens_per_sec: float | None,
        bandwidth_per_sec: float | None,
        evals: Mapping[str, float] | None = None,
    ) -> None:
        """Count a witness's report for `step` (the server's step when it was accepted)."""
        scores = {
            name: float(value)
            for name, value in (evals or {}).items()
            if isinstance(value, float | int) and math.isfinite(value)
        }
        report = WitnessReport(
            _usable(loss), _usable(tokens_per_sec), _usable(bandwidth_per_sec), scores
        )
        reports = self._steps.get(step)
        if reports is None:
            if self._steps and step < next(iter(self._steps)) and len(self._steps) >= self.history:
                return  # older than everything kept: it would be forgotten at once
            reports = self._steps[step] = {}
            self._steps = OrderedDict(sorted(self._steps.items()))
            while len(self._steps) > self.history:
                self._steps.popitem(last=False)
        if client_id not in reports and len(reports) >= MAX_REPORTS_PER_STEP:
            return
        reports[client_id] = report
        self.witness_reports_total += 1

    def count_convictions(self, new: int) -> None:
        self.convictions_total += max(0, new)

    def observe_departures(self, epoch: int, client_ids: Iterable[bytes]) -> None:
        """The clients that have left `epoch` so far (each counted once per epoch)."""
        if epoch != self._departed_epoch:
            self._departed_epoch = epoch
            self._departed = set()
        for client_id in client_ids:
            key = (epoch, client_id)
            if key not in self._departed:
                self._departed.add(key)
                self.departures_total += 1

    # ------------------------------------------------------------------ reading

    def summary(self, step: int) -> StepSummary | None:
        reports = self._steps.get(step)
        if reports is None:
            return None
        return StepSummary(
            step=step,
            reports=len(reports),
            loss=_median(r.loss for r in reports.values()),
            tokens_per_sec=_median(r.tokens_per_sec for r in reports.values()),
            bandwidth_per_sec=_median(r.bandwidth_per_sec for r in reports.values()),
            evals=_eval_medians(reports.values()),
        )

    def steps(self) -> list[StepSummary]:
        """Every kept step's summary, oldest first."""
        return [s for s in (self.summary(step) for step in self._steps) if s is not None]

    def latest(self) -> StepSummary | None:
        for step in reversed(self._steps):
            summary = self.summary(step)
            if summary is not None and (
                summary.loss is not None or summary.tokens_per_sec is not None
            ):
                return summary
        return None

    def latest_evals(self) -> dict[str, tuple[int, float]]:
        """Per eval name, (step, median) of the newest kept step where a witness reported it."""
        latest: dict[str, tuple[int, float]] = {}
        for summary in self.steps():
            for name, value in summary.evals.items():
                latest[name] = (summary.step, value)
        return dict(sorted(latest.items()))

    def snapshot(
        self,
        *,
        run_id: str,
        step: int,
        epoch: int,
        run_state: str,
        members: int,
        pending: int,
        relay_bytes_total: int,
    ) -> MetricsSnapshot:
        return MetricsSnapshot(
            run_id=run_id,
            step=step,
            epoch=epoch,
            run_state=run_state,
            members=members,
            pending=pending,
            latest=self.latest(),
            witness_reports_total=self.witness_reports_total,
            convictions_total=self.convictions_total,
            departures_total=self.departures_total,
            relay_bytes_total=relay_bytes_total,
            evals=self.latest_evals(),
        )


class MetricsBoard:
    """The latest snapshot, published by the event loop and read by exporter threads (one
    reference swap: no lock, no waiting)."""

    def __init__(self, snapshot: MetricsSnapshot) -> None:
        self._snapshot = snapshot

    def publish(self, snapshot: MetricsSnapshot) -> None:
        self._snapshot = snapshot

    def read(self) -> MetricsSnapshot:
        return self._snapshot
