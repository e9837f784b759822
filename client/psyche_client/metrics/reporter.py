"""`StepReporter`: the part that hands a client's figures to its metrics sink.

The app calls `observe(coordinator)` after the round pipeline has taken each new coordinator
state. A step S is open while the coordinator is in S's RoundTrain or RoundWitness; once the
coordinator has moved on (the next step's round, a Cooldown, a lost epoch) S is finished: its
`StepFigures` are built from the client's statistics, its P2P traffic at S and the time it
lasted, logged (`step metrics`) and sent to the sink. Optimizer statistics
(`--optim-stats-steps`) are taken from the backend at each call, logged (`optimizer
statistics`) and sent as `optim/<parameter>.<statistic>`. `extra(step, values)` sends other
figures of a step as they are (evals: `eval/<task>`).

Everything here runs on the event loop and is quick: the sink never blocks.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from psyche_common.coordinator import Coordinator, RunState
from psyche_common.lr_schedule import effective_lr

from psyche_client.metrics.sink import ClientMetricsSink
from psyche_client.metrics.step_values import StepFigures
from psyche_client.p2p.stats import TransferStats
from psyche_client.round.stats import ClientStats

log = logging.getLogger("psyche.client")

OptimStats = Callable[[], list[tuple[int, dict[str, float]]]]
"""Takes the optimizer statistics measured since the last call (none: an empty list)."""

ROUND_STATES = (RunState.RoundTrain, RunState.RoundWitness)


@dataclass(frozen=True)
class _OpenStep:
    step: int
    epoch: int
    num_clients: int
    lr: float | None
    started: float


def _lr(coordinator: Coordinator) -> float | None:
    step = coordinator.progress.step
    try:
        lr = effective_lr(
            coordinator.model.lr_schedule, step, coordinator.get_cold_start_warmup_bounds()
        )
    except (ValueError, ArithmeticError):
        return None
    return float(lr)


class StepReporter:
    def __init__(
        self,
        sink: ClientMetricsSink,
        stats: ClientStats,
        traffic: TransferStats,
        optim_stats: OptimStats = list,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.stats = stats
        self.traffic = traffic
        self.optim_stats = optim_stats
        self.clock = clock
        self._open: _OpenStep | None = None

    def observe(self, coordinator: Coordinator) -> None:
        """A new coordinator state (after the round pipeline took it)."""
        now = self.clock()
        step = coordinator.progress.step
        in_round = coordinator.run_state in ROUND_STATES
        if self._open is not None and (not in_round or step != self._open.step):
            self._finish(self._open, now)
            self._open = None
        if in_round and self._open is None:
            self._open = _OpenStep(
                step,
                coordinator.progress.epoch,
                len(coordinator.epoch_state.clients),
                _lr(coordinator),
                now,
            )
        self.report_optim_stats()

    def extra(self, step: int, values: Mapping[str, float]) -> None:
        """Other figures of `step`, sent as named (e.g. `eval/<task>`); non-finite ones are
        left out."""
        finite = {k: float(v) for k, v in values.items() if math.isfinite(v)}
        if finite:
            self.sink.log(step, finite)

    def eval_scores(self, step: int, scores: Mapping[str, float]) -> None:
        """An eval's figures, as `eval/<task>` and `eval/<task>/<metric>`."""
        self.extra(step, {f"eval/{name}": value for name, value in scores.items()})

    def report_optim_stats(self) -> None:
        for step, values in self.optim_stats():
            log.info(
                "optimizer statistics",
                extra={"step": step, "optim": values, **_summary(values)},
            )
            self.extra(step, {f"optim/{name}": value for name, value in values.items()})

    def _finish(self, open_step: _OpenStep, now: float) -> None:
        traffic = self.traffic.for_step(open_step.step)
        figures = StepFigures(
            step=open_step.step,
            epoch=open_step.epoch,
            num_clients=open_step.num_clients,
            lr=open_step.lr,
            loss=self.stats.loss_at(open_step.step),
            tokens_per_sec=self.stats.tokens_per_sec,
            efficiency=self.stats.efficiency,
            total_tokens=self.stats.total_tokens,
            applied_results=self.stats.applied_results.get(open_step.step),
            bytes_up=traffic.bytes_sent,
            bytes_down=traffic.bytes_received,
            seconds=now - open_step.started,
        )
        values = figures.values()
        log.info("step metrics", extra={"step": open_step.step, "metrics": values})
        self.sink.log(open_step.step, values)


def _summary(values: Mapping[str, float]) -> dict[str, float]:
    """The mean over parameters of each statistic (`captured_energy` → `mean_captured_energy`),
    for the log line."""
    by_kind: dict[str, list[float]] = {}
    for name, value in values.items():
        kind = name.rsplit(".", 1)[-1]
        by_kind.setdefault(kind, []).append(value)
    return {f"mean_{kind}": statistics.fmean(found) for kind, found in by_kind.items()}
