"""Preparing the next round while the current round's witnesses report.

When the coordinator is in RoundWitness with every witness in (`predict_next_round`), the
next round's apply (this round's witnesses decide it) and its batches (its seed is already
published) are known. The preparer then applies early — after taking a snapshot of the
weights — and trains the predicted batches, holding their results unpublished. At the real
RoundTrain the runner asks `outcome` how the prediction fared:

- `ADOPT`: same witnesses, same round: the prepared round becomes the current one and its
  held results are published;
- `KEEP_APPLY`: same witnesses, different work (a member left, the epoch timed out): the
  early apply stands, the prepared training is discarded;
- `REVERT`: the apply's input changed, or there is no next round (Cooldown, epoch end): the
  prepared training is discarded and the weights are restored from the snapshot.

Every honest client makes the same decisions from the same coordinator states, so all of them
apply the same results in the same order whether or not they prepared early.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from psyche_common.coordinator import Coordinator, Witness

from psyche_client.round.apply import ApplyStep
from psyche_client.round.context import RoundContext
from psyche_client.round.next_round import RoundKey, predict_next_round, witnesses_key
from psyche_client.round.ports import RunnerOptions
from psyche_client.round.roles import RoundRoles, derive_round_roles
from psyche_client.round.state import RoundState
from psyche_client.round.training import RoundTraining
from psyche_client.training.backend import WeightsSnapshot

log = logging.getLogger("psyche.client")


class Outcome(Enum):
    ADOPT = "adopt"
    KEEP_APPLY = "keep apply"
    REVERT = "revert"


@dataclass
class PreparedRound:
    key: RoundKey
    witnesses: list[dict[str, Any]]
    round_: RoundState
    apply_task: asyncio.Task[bytes | None] | None = None
    train_task: asyncio.Task[None] | None = None
    snapshot: WeightsSnapshot | None = field(default=None, repr=False)

    def outcome(self, roles: RoundRoles, have_training: bool, witnesses: list[Witness]) -> Outcome:
        if self.key.step != roles.step or self.witnesses != witnesses_key(witnesses):
            return Outcome.REVERT
        if self.key != RoundKey.of(roles, have_training):
            return Outcome.KEEP_APPLY
        return Outcome.ADOPT


class NextRoundPreparer:
    def __init__(
        self,
        ctx: RoundContext,
        apply: ApplyStep,
        training: RoundTraining,
        options: RunnerOptions,
    ) -> None:
        self.ctx = ctx
        self.apply = apply
        self.training = training
        self.options = options
        self.prepared: PreparedRound | None = None

    def prepare(self, coordinator: Coordinator) -> None:
        """Start the next round early if it is known (at most once per round)."""
        current = self.ctx.current
        if not self.options.prepare_next_round or self.prepared is not None or current is None:
            return
        if self.ctx.out_of_sync is not None:
            return
        predicted = predict_next_round(coordinator)
        if predicted is None:
            return
        have_training = predicted.epoch_state.last_step == 0
        roles = derive_round_roles(predicted, self.ctx.me, have_training)
        round_ = RoundState.start(
            roles,
            len(predicted.epoch_state.clients),
            have_training,
            time.monotonic(),
            confirmed=False,
        )
        witnesses = list(coordinator.current_round().witnesses)
        prepared = PreparedRound(
            RoundKey.of(roles, have_training), witnesses_key(witnesses), round_
        )
        self.prepared = prepared
        self.ctx.require_backend().begin_round(predicted)
        previous = self.ctx.previous
        tasks = self.ctx.tasks
        # long-lived: only `revert` may stop them (a cancelled task would leave its worker
        # thread running on the model)
        if current.height > 0 and previous is not None:
            prepared.apply_task = tasks.spawn(
                self._apply(prepared, previous, witnesses, coordinator), round_scoped=False
            )
        prepared.train_task = tasks.spawn(
            self.training.train(round_, prepared.apply_task), round_scoped=False
        )
        log.info(
            "preparing step %d while the witnesses report",
            roles.step,
            extra=self.ctx.fields(batches=[str(b) for b in roles.my_batches]),
        )

    async def _apply(
        self,
        prepared: PreparedRound,
        source: RoundState,
        witnesses: list[Witness],
        coordinator: Coordinator,
    ) -> bytes | None:
        backend = self.ctx.require_backend()
        async with self.ctx.model_lock:
            prepared.snapshot = await asyncio.to_thread(backend.snapshot)
        return await self.apply.apply(source, witnesses, coordinator, prepared.key.step)

    async def settle(
        self,
        prepared: PreparedRound | None,
        outcome: Outcome | None,
        source: RoundState | None,
        witnesses: list[Witness],
        coordinator: Coordinator,
        step: int,
    ) -> bytes | None:
        """What must happen before this round trains: settle the prepared round (keep its
        apply, or undo it), then apply round h−2 unless the prepared apply stands. Returns the
        weights hash after an apply (None when nothing was applied)."""
        if prepared is not None and outcome == Outcome.KEEP_APPLY:
            await self.discard_training(prepared)
            return None if prepared.apply_task is None else await prepared.apply_task
        if prepared is not None:
            await self.revert(prepared, "the next round is not the predicted one")
        if source is not None:
            return await self.apply.apply(source, witnesses, coordinator, step)
        return None

    def take(self) -> PreparedRound | None:
        prepared, self.prepared = self.prepared, None
        return prepared

    async def discard_training(self, prepared: PreparedRound) -> None:
        """Stop the prepared training and forget its results (the apply stays)."""
        prepared.round_.cancelled = True
        if prepared.train_task is not None:
            await asyncio.gather(prepared.train_task, return_exceptions=True)
        await self.training.discard(prepared.round_)

    async def revert(self, prepared: PreparedRound, reason: str) -> None:
        """Undo everything the prepared round did: its training and its early apply."""
        await self.discard_training(prepared)
        if prepared.apply_task is not None:
            await asyncio.gather(prepared.apply_task, return_exceptions=True)
        if prepared.snapshot is not None:
            backend = self.ctx.require_backend()
            async with self.ctx.model_lock:
                await asyncio.to_thread(backend.restore, prepared.snapshot)
            log.info(
                "undid the early apply of step %d: %s",
                prepared.key.step,
                reason,
                extra=self.ctx.fields(weights_hash=backend.weights_hash().hex()),
            )

    def abandon(self, reason: str) -> asyncio.Task[None] | None:
        """There is no next round after all: revert what was prepared, in the background."""
        prepared = self.take()
        if prepared is None:
            return None
        self.ctx.stats.prepared_rounds["revert"] += 1
        return self.ctx.tasks.spawn(self.revert(prepared, reason), round_scoped=False)
