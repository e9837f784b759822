"""What the server does with each client message: the connection side of `client_messages`.

`MessageDispatcher` counts the message, hands a `Join` to `membership`, and applies every other
message to the coordinator (`client_messages.apply_client_message`), logging a refusal (the
sender stays connected). Around that it records what the run's health checks need: a reported
weights hash (`consistency`) and each accepted witness's figures (`run_metrics`), logging eval
scores that changed. Every message then asks `scheduler` for a message tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.errors import CoordinatorError
from psyche_common.protocol import short_id
from psyche_common.protocol.messages import AnyClientMessage, Join, Witness

from .client_messages import apply_client_message, reported_weights
from .connections import Connection
from .consistency import WeightsHashMonitor
from .joiner_proofs import JoinerProofs
from .options import ServerStats
from .run_metrics import RunMetrics
from .scheduler import TickScheduler

log = logging.getLogger("psyche.server")

MAX_REPORTED_EVALS = 4096
"""Clients whose last reported eval scores are remembered (to log only new ones)."""


class MessageDispatcher:
    """Routes each client message (`ConnectionManager`'s `on_message`)."""

    def __init__(
        self,
        coordinator: Coordinator,
        clock: Callable[[], float],
        checkpointers: Collection[bytes],
        stats: ServerStats,
        weights: WeightsHashMonitor,
        metrics: RunMetrics,
        scheduler: TickScheduler,
        on_join: Callable[[Connection, Join], None],
        joiner_proofs: JoinerProofs | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.clock = clock
        self.checkpointers = checkpointers
        """Keys whose `Checkpoint` messages may set the run's checkpoint (`--checkpointer`)."""
        self.stats = stats
        self.weights = weights
        self.metrics = metrics
        self.scheduler = scheduler
        self._on_join = on_join
        self.joiner_proofs = joiner_proofs
        self._reported_evals: dict[bytes, dict[str, float]] = {}

    async def on_message(self, conn: Connection, message: AnyClientMessage) -> None:
        self.stats.messages += 1
        self.scheduler.message_arrived()
        client_id = conn.peer_id
        if isinstance(message, Join):
            self._on_join(conn, message)
        else:
            report = reported_weights(message)
            if report is not None:
                # counted only from a member of this epoch (followed at every tick)
                self.weights.advance(self.coordinator.progress.step)
                self.weights.record(report[0], client_id, report[1])
                if self.joiner_proofs is not None:  # a mid-epoch joiner's proof
                    self.joiner_proofs.offer(client_id, report[0], report[1])
            step = self.coordinator.progress.step
            try:
                apply_client_message(
                    self.coordinator,
                    client_id,
                    message,
                    self.clock(),
                    self.checkpointers,
                )
            except CoordinatorError as exc:
                self.stats.coordinator_errors += 1
                log.warning(
                    "%s from %s refused: %s",
                    message.type,
                    short_id(client_id),
                    exc,
                    extra={
                        "client": short_id(client_id),
                        "message_type": message.type,
                        "error": str(exc),
                    },
                )
            else:
                if isinstance(message, Witness):  # counted only once the coordinator took it
                    metadata = message.metadata
                    self.metrics.record_witness(
                        step,
                        client_id,
                        metadata.loss,
                        metadata.tokens_per_sec,
                        metadata.bandwidth_per_sec,
                        metadata.evals,
                    )
                    self._log_new_evals(client_id, step, metadata.evals)
        self.scheduler.schedule_message_tick()

    def _log_new_evals(self, client_id: bytes, step: int, evals: Mapping[str, float]) -> None:
        """Log a witness's eval scores when they differ from the last ones it reported (each
        report repeats the client's latest scores)."""
        if not evals or self._reported_evals.get(client_id) == evals:
            return
        if len(self._reported_evals) >= MAX_REPORTED_EVALS:
            self._reported_evals.clear()
        self._reported_evals[client_id] = dict(evals)
        log.info(
            "eval scores reported",
            extra={"client": short_id(client_id), "step": step, "evals": dict(evals)},
        )
