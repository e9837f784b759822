"""Joining an epoch mid-way, the client's side (`[config] join_mid_epoch`; the coordinator's
side is `psyche_common.coordinator.joining`, the path docs/client.md, "Joining mid-epoch").

A client that arrives while an epoch runs loads its backend at once (the run's checkpoint, or
the members' last shared model: only its layout matters, the weights are replaced) and says
it holds a model (`Join`), so the coordinator admits it to `epoch_state.joining` at the next
round start, round h. From round h on the round pipeline runs for it as for a member with no
committee: it collects and verifies every result, applying nothing yet (every apply waits for
`RoundContext.weights_ready`). At round h + 1 the members share their weights of that step
(`SnapshotShare`, after their apply); the joiner loads them (`SnapshotLoader`), reports their
hash at that step, which the server compares with the members' majority, and its queued apply
of round h's results then brings it to the members' weights of round h + 2. Seated at the
round start after the server's check, it trains from that round on.

It loads the snapshot only when it followed round h from its start: the apply of round h
onto the snapshot needs every result of round h. Otherwise (or when the snapshot cannot be
had) it waits until the coordinator removes it (`JOIN_TIMEOUT_ROUNDS`) and admits it afresh.
"""

from __future__ import annotations

import asyncio
import logging

from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.joining import joiner, snapshot_height, snapshot_step

from psyche_client.p2p.model_share import ModelShareError
from psyche_client.round.context import RoundContext
from psyche_client.round.ports import SnapshotLoader, Uplink

log = logging.getLogger("psyche.client")

FETCHING = "joining: fetching the model"
IN_SYNC = "joining: in sync, waiting for a seat"


class MidEpochJoin:
    """Our side of one mid-epoch join at a time (see the module docstring)."""

    def __init__(self, ctx: RoundContext, uplink: Uplink, load: SnapshotLoader | None) -> None:
        self.ctx = ctx
        self.uplink = uplink
        self.load = load
        self.since: int | None = None
        """The round we were admitted at (None: not joining)."""
        self.first_round: int | None = None
        """The first round we followed since that admission."""
        self._task: asyncio.Task[None] | None = None
        self._admitted: int | None = None
        """The round of the admission we follow (a new one is logged)."""

    @property
    def active(self) -> bool:
        return self.since is not None

    def on_state(self, coordinator: Coordinator) -> bool:
        """Follow our joiner record in a new state; True when we were admitted afresh (the
        caller then forgets the rounds it followed before)."""
        ctx = self.ctx
        record = joiner(coordinator, ctx.me)
        if record is None:
            if self.since is not None:
                self._end(seated=ctx.me in ctx.members())
            return False
        fresh = record.since_height != self.since
        if fresh:
            announce = record.admitted_height != self._admitted
            self._admitted = record.admitted_height
            self._begin(record.since_height, snapshot_step(coordinator, record), announce)
        height = coordinator.current_round().height
        if (
            self._task is None
            and not ctx.weights_ready.is_set()
            and height >= snapshot_height(record)
            and self.first_round == record.since_height
            and self.load is not None
        ):
            step = snapshot_step(coordinator, record)
            self._task = ctx.tasks.spawn(self._load_snapshot(coordinator, step), round_scoped=False)
        return fresh

    def round_started(self, height: int) -> None:
        """The pipeline started round `height` for us while we are joining."""
        if self.since is not None and self.first_round is None:
            self.first_round = height
            if height != self.since:
                log.warning(
                    "joined at round %d but followed the rounds only from round %d: waiting "
                    "to be admitted again",
                    self.since,
                    height,
                    extra=self.ctx.fields(),
                )

    def _begin(self, since: int, step: int, announce: bool) -> None:
        """Follow the rounds from `since` (a new admission, or a later round because we held
        no model at the round start before)."""
        ctx = self.ctx
        if self._task is not None:
            self._task.cancel()
        self._task = None
        self.since, self.first_round = since, None
        ctx.weights_ready.clear()
        ctx.stats.sync_status = FETCHING
        if announce:
            log.info(
                "admitted mid-epoch: following the rounds from round %d, then fetching the "
                "members' weights of step %d",
                since,
                step,
                extra=ctx.fields(),
            )

    def _end(self, seated: bool) -> None:
        ctx = self.ctx
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        self.since = self.first_round = self._admitted = None
        if seated:
            ctx.stats.sync_status = "in sync"
            log.info("seated mid-epoch: training from this round", extra=ctx.fields())
        else:
            # not seated (removed, or the epoch ended): the next Warmup checks the weights
            ctx.weights_ready.set()
            ctx.stats.sync_status = "waiting for the next epoch"
            log.info("no longer joining this epoch", extra=ctx.fields())

    async def _load_snapshot(self, coordinator: Coordinator, step: int) -> None:
        ctx = self.ctx
        assert self.load is not None
        backend = ctx.require_backend()
        try:
            await self.load(coordinator, backend, step)
        except ModelShareError as exc:
            log.warning(
                "could not fetch the members' weights of step %d: %s; waiting to be admitted again",
                step,
                exc,
                extra=ctx.fields(),
            )
            return
        weights = backend.weights_hash()
        ctx.weights_ready.set()
        ctx.stats.sync_status = IN_SYNC
        log.info(
            "loaded the members' weights of step %d",
            step,
            extra=ctx.fields(step=step, weights_hash=weights.hex()),
        )
        ctx.stats.applied(step, weights)
        await self.uplink.send_health_check([], step, weights)
