"""Preparing the next round while the current round's witnesses report.

When the coordinator is in RoundWitness with every witness in (`predict_next_round`), the
next round's apply (this round's witnesses decide it) and its batches (its seed is already
published) are known. The preparer then applies early — after taking a snapshot of the
weights — and trains the predicted batches, holding their results unpublished. At the real
RoundTrain the runner takes the prediction over with `hand_off`, which says how it fared as a
`RoundStart`:

- `Adopted`: same witnesses, same round: the prepared round, already confirmed, becomes the
  current one and its held results are published;
- `Kept`: same witnesses, different work (a member left, the epoch timed out): the early apply
  stands, the prepared training is discarded (`settle`);
- `Reverted`: the apply's input changed: the prepared training is discarded and the weights
  are restored from the snapshot (`settle`); with no next round at all (Cooldown, epoch end)
  `abandon` does the same;
- `NotPrepared`: nothing was prepared.

Every honest client makes the same decisions from the same coordinator states, so all of them
apply the same results in the same order whether or not they prepared early.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

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


@dataclass
class PreparedRound:
    key: RoundKey
    witnesses: list[dict[str, Any]]
    round_: RoundState
    """PREDICTED until the hand-off."""
    apply_task: asyncio.Task[bytes | None] | None = None
    train_task: asyncio.Task[None] | None = None
    snapshot: WeightsSnapshot | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Adopted:
    """The prediction held: `round_` is this round. Made only by `hand_off`, which confirms the
    round first, so the announcements kept for its step are filed in it when replayed."""

    round_: RoundState
    apply_task: asyncio.Task[bytes | None] | None
    """The early apply (None when there was nothing to apply): what this round waits for."""
    label: ClassVar[str] = "adopt"

    def __post_init__(self) -> None:
        if not self.round_.confirmed:
            raise ValueError(f"step {self.round_.step}: an adopted round must be confirmed")


@dataclass(frozen=True)
class Kept:
    """Same witnesses, different work: the early apply stands, the prepared training goes."""

    prepared: PreparedRound
    label: ClassVar[str] = "keep apply"


@dataclass(frozen=True)
class Reverted:
    """The prediction failed: the prepared training and the early apply are undone."""

    prepared: PreparedRound
    label: ClassVar[str] = "revert"


@dataclass(frozen=True)
class NotPrepared:
    """Nothing was prepared for this round."""

    label: ClassVar[str] = "no"


RoundStart = Adopted | Kept | Reverted | NotPrepared
"""What becomes of the prepared round when the real round starts (`hand_off`)."""


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
            predicted=True,
        )
        witnesses = list(coordinator.current_round().witnesses)
        prepared = PreparedRound(
            RoundKey.of(roles, have_training), witnesses_key(witnesses), round_
        )
        self.prepared = prepared
        self.ctx.require_backend().begin_round(predicted.get_cold_start_warmup_bounds())
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

    def hand_off(
        self, roles: RoundRoles, have_training: bool, witnesses: list[Witness]
    ) -> RoundStart:
        """The real round starts (its roles, its apply's witnesses): take the prepared round
        over, judge the prediction (counted in the stats) and confirm the round if adopted."""
        prepared = self.take()
        if prepared is None:
            return NotPrepared()
        start: Adopted | Kept | Reverted
        if prepared.key.step != roles.step or prepared.witnesses != witnesses_key(witnesses):
            start = Reverted(prepared)
        elif prepared.key != RoundKey.of(roles, have_training):
            start = Kept(prepared)
        else:
            prepared.round_.confirm()
            start = Adopted(prepared.round_, prepared.apply_task)
        self.ctx.stats.prepared_rounds[start.label] += 1
        return start

    async def settle(
        self,
        start: Kept | Reverted | NotPrepared,
        source: RoundState | None,
        witnesses: list[Witness],
        coordinator: Coordinator,
        step: int,
    ) -> bytes | None:
        """What must happen before a round that was not adopted trains: keep the prepared
        apply, or undo it and apply round h−2 (`source`) now. Returns the weights hash after
        an apply (None when nothing was applied)."""
        if isinstance(start, Kept):
            await self.discard_training(start.prepared)
            apply_task = start.prepared.apply_task
            return None if apply_task is None else await apply_task
        if isinstance(start, Reverted):
            await self.revert(start.prepared, "the next round is not the predicted one")
        if source is not None:
            return await self.apply.apply(source, witnesses, coordinator, step)
        return None

    def busy(self) -> bool:
        """A next round is being prepared: its apply or its training is still running."""
        prepared = self.prepared
        if prepared is None:
            return False
        return any(
            task is not None and not task.done()
            for task in (prepared.apply_task, prepared.train_task)
        )

    def take(self) -> PreparedRound | None:
        prepared, self.prepared = self.prepared, None
        return prepared

    async def discard_training(self, prepared: PreparedRound) -> None:
        """Stop the prepared training and forget its results (the apply stays)."""
        prepared.round_.cancel()
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
        self.ctx.stats.prepared_rounds[Reverted.label] += 1
        return self.ctx.tasks.spawn(self.revert(prepared, reason), round_scoped=False)
