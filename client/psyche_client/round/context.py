"""What every part of the round pipeline shares: who we are, the latest coordinator state,
the model, the current and previous rounds, the model lock and the task set.

The runner owns the context and is the only writer of `coordinator`, `phase`, `current` and
`previous`; the parts read them and change only the round states they are handed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from psyche_common.client_id import short_id
from psyche_common.coordinator import Coordinator
from psyche_common.protocol import Identity

from psyche_client.round.phase import Phase
from psyche_client.round.state import RoundState
from psyche_client.round.stats import ClientStats
from psyche_client.round.tasks import TaskSet
from psyche_client.training.backend import TrainingBackend

log = logging.getLogger("psyche.client")


@dataclass
class RoundContext:
    identity: Identity
    stats: ClientStats
    coordinator: Coordinator | None = None
    backend: TrainingBackend | None = None
    phase: Phase = Phase.IDLE
    current: RoundState | None = None
    previous: RoundState | None = None
    out_of_sync: str | None = None
    """Why this client's weights may differ from its peers' (None: in sync). While set it
    neither trains nor witnesses; the next Warmup's weights check resyncs it."""
    model_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    weights_ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while the backend holds weights the rounds' results may be applied to: always,
    except for a mid-epoch joiner until it loaded the members' snapshot (`round.joiner`);
    every apply waits for it."""
    tasks: TaskSet = field(init=False)

    def __post_init__(self) -> None:
        self.tasks = TaskSet(self.fields)
        self.weights_ready.set()

    @property
    def me(self) -> bytes:
        return self.identity.public_key

    def require_backend(self) -> TrainingBackend:
        if self.backend is None:
            raise RuntimeError("the round pipeline ran before the model was loaded")
        return self.backend

    def members(self) -> list[bytes]:
        """The epoch's client ids, in committee order (empty before the first state)."""
        if self.coordinator is None:
            return []
        return [client.id for client in self.coordinator.epoch_state.clients]

    def lose_sync(self, cause: str) -> None:
        """Stop training and witnessing until the next Warmup resyncs the weights."""
        if self.out_of_sync is None:
            log.warning(
                "out of sync: %s; sitting out until the next Warmup resyncs from peers",
                cause,
                extra=self.fields(),
            )
        self.out_of_sync = cause
        self.stats.sync_status = f"out of sync: {cause}"
        for round_ in (self.current, self.previous):
            if round_ is not None:
                round_.cancel()

    def round_for_step(self, step: int) -> RoundState | None:
        for round_ in (self.current, self.previous):
            if round_ is not None and round_.step == step:
                return round_
        return None

    def fields(self, **extra: Any) -> dict[str, Any]:
        """Structured log fields: client, epoch, step and run state, plus ``extra``."""
        fields: dict[str, Any] = {"client_id": short_id(self.me)}
        if self.coordinator is not None:
            fields.update(
                epoch=self.coordinator.progress.epoch,
                step=self.coordinator.progress.step,
                state=self.coordinator.run_state.name,
            )
        fields.update(extra)
        return fields
