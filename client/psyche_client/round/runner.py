"""The client's round pipeline: follows coordinator states and peer announcements.

`RoundRunner` composes the parts — `Warmup`, `ResultExchange`, `RoundTraining`, `ApplyStep`,
`Witnessing`, `NextRoundPreparer`, `CooldownStep`, `RoundVerifier` — around one
`RoundContext`, and reacts to each coordinator state with the action the (phase, run state)
table names (`phase.ACTIONS`).
It never blocks the event loop: training, decoding and applying run in worker threads under
one model lock; downloads and fetches are tasks with timeouts. Transport is behind
`PeerNetwork` and `Uplink`, the model behind `TrainingBackend`, so it runs in-process in tests.
One policy is passed in too, with the honest one as default: which trainers a witness accuses
(`accuse`); test and attack clients swap it through `app.parts.Parts`.

Per round h: apply round h−2's consensus results (early, while round h−1's witnesses report,
when they are all in), train round h's batches and publish them, download round h−1's
results, announce Finished, witness; at Cooldown share and save the model. docs/client.md.
"""

from __future__ import annotations

import asyncio
import logging
import time

from psyche_common.announcements import FinishedAnnouncement
from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.joining import snapshot_height
from psyche_common.protocol import Identity
from psyche_common.retry import call, doubling, failure, retry_on, retrying
from tenacity import RetryCallState

from psyche_client.p2p.inbox import Taken, VerifiedAnnouncement
from psyche_client.round.apply import ApplyStep
from psyche_client.round.context import RoundContext
from psyche_client.round.cooldown import CooldownStep
from psyche_client.round.exchange import ResultExchange
from psyche_client.round.health import AccusationPolicy, clients_to_accuse
from psyche_client.round.joiner import MidEpochJoin
from psyche_client.round.phase import Action, Phase, action_for
from psyche_client.round.ports import (
    BackendLoader,
    CooldownHook,
    DataFetcher,
    ModelUnavailable,
    PeerNetwork,
    RunnerOptions,
    SnapshotLoader,
    SnapshotShare,
    Uplink,
    WeightsCheck,
)
from psyche_client.round.prepare import Adopted, NextRoundPreparer
from psyche_client.round.rejoin import Rejoin
from psyche_client.round.roles import derive_round_roles
from psyche_client.round.state import RoundState
from psyche_client.round.stats import ClientStats
from psyche_client.round.training import RoundTraining
from psyche_client.round.verifier import RoundVerifier
from psyche_client.round.warmup import Warmup
from psyche_client.round.witness import Witnessing
from psyche_client.training.backend import TrainingBackend

log = logging.getLogger("psyche.client")


class RoundRunner:
    """One client's pipeline; feed it `on_state`, `on_announcement` and `tick` (every 0.5 s)."""

    def __init__(
        self,
        identity: Identity,
        network: PeerNetwork,
        uplink: Uplink,
        load_backend: BackendLoader,
        fetch_samples: DataFetcher | None,
        options: RunnerOptions,
        on_cooldown: CooldownHook | None = None,
        stats: ClientStats | None = None,
        check_weights: WeightsCheck | None = None,
        accuse: AccusationPolicy = clients_to_accuse,
        share_snapshot: SnapshotShare | None = None,
        load_snapshot: SnapshotLoader | None = None,
    ) -> None:
        self.ctx = RoundContext(identity, stats or ClientStats())
        self.uplink = uplink
        self.network = network
        self.load_backend = load_backend
        self.options = options
        self.exchange = ResultExchange(self.ctx, network, options, self._poke, uplink)
        self.verifier = RoundVerifier(self.ctx, uplink, fetch_samples, options.verify_threshold)
        self.training = RoundTraining(
            self.ctx, self.exchange, fetch_samples, options, self._poke, self.verifier
        )
        self.applier = ApplyStep(self.ctx, uplink)
        self.witnessing = Witnessing(self.ctx, network, uplink, self.exchange, accuse)
        self.warmup = Warmup(self.ctx, network, uplink, check_weights, self._reload_model)
        self.preparer = NextRoundPreparer(self.ctx, self.applier, self.training, options)
        self.cooldown = CooldownStep(self.ctx, on_cooldown)
        self.rejoin = Rejoin(self.ctx, uplink)
        self.joiner = MidEpochJoin(self.ctx, uplink, load_snapshot)
        self.share_snapshot = share_snapshot
        self._init_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ views

    @property
    def stats(self) -> ClientStats:
        return self.ctx.stats

    @property
    def phase(self) -> Phase:
        return self.ctx.phase

    @property
    def backend(self) -> TrainingBackend | None:
        return self.ctx.backend

    @backend.setter
    def backend(self, backend: TrainingBackend | None) -> None:
        self.ctx.backend = backend

    @property
    def current(self) -> RoundState | None:
        return self.ctx.current

    @property
    def previous(self) -> RoundState | None:
        return self.ctx.previous

    @property
    def fatal(self) -> BaseException | None:
        return self.ctx.tasks.fatal

    def is_idle(self) -> bool:
        """Whether the client would now only wait: the model is loaded and nothing is due of
        it (Warmup, Cooldown, or a round whose training has ended while no next round is being
        prepared). Evals run only then (`psyche_client.evals`)."""
        ctx = self.ctx
        if ctx.backend is None or ctx.phase == Phase.IDLE:
            return False
        if ctx.phase in (Phase.WARMUP, Phase.COOLDOWN):
            return True
        if ctx.current is not None and not ctx.current.training_done:
            return False
        return not self.preparer.busy()

    async def wait_fatal(self) -> BaseException:
        return await self.ctx.tasks.wait_fatal()

    async def aclose(self) -> None:
        await self.ctx.tasks.aclose()

    # ------------------------------------------------------------------ inputs

    async def on_state(self, coordinator: Coordinator) -> None:
        """A new coordinator state arrived from the server (already de-duplicated)."""
        ctx = self.ctx
        ctx.coordinator = coordinator
        ctx.stats.observe_state(coordinator)
        self.verifier.check_rounds()  # a round's verifier sample may have been revealed
        if ctx.backend is not None:
            await self.rejoin.check(coordinator)
        if self.joiner.on_state(coordinator) and ctx.phase in (Phase.TRAINING, Phase.WITNESS):
            self._reset_to_warmup()  # admitted afresh: what we followed before is of no use
        await self._do(self._action(ctx.phase, coordinator), coordinator)

    def _action(self, phase: Phase, coordinator: Coordinator) -> Action:
        since = self.joiner.since
        return action_for(
            phase,
            coordinator.run_state,
            self.ctx.me in self.ctx.members(),
            is_joiner=since is not None,
            # a joiner follows the rounds from its `since_height` on (a joiner that had no
            # model at a round start follows from a later one)
            follows=since is not None and coordinator.current_round().height >= since,
            # loading before its admission needs no member (a checkpoint repository); the
            # members' shared model is for joiners only
            may_join=coordinator.config.join_mid_epoch and not coordinator.model.checkpoint.is_p2p,
        )

    def lose_sync(self, cause: str) -> None:
        """Our weights are known to differ from the majority's (the server said so): stop
        training and witnessing until the next Warmup resyncs them."""
        self.ctx.lose_sync(cause)

    def on_announcement(self, verified: VerifiedAnnouncement) -> Taken:
        """An announcement arrived from a peer (or was re-broadcast), its signatures checked
        by the P2P inbox: route it (warmup readiness, or the round it names). `NOT_NOW`: not
        taken now (no model yet, too far ahead, over its sender's quota); `REFUSED`: never
        (`exchange.route`, `warmup.on_announcement`)."""
        announcement = verified.announcement
        if isinstance(announcement, FinishedAnnouncement) and announcement.warmup:
            return self.warmup.on_announcement(announcement, self.ctx.coordinator)
        if self.ctx.backend is None or self.ctx.coordinator is None:
            return Taken.NOT_NOW
        return self.exchange.route(verified)

    async def tick(self) -> None:
        """The 500 ms timer: warmup readiness, Finished + witness, re-announcements."""
        if self.ctx.coordinator is None or self.ctx.backend is None:
            return
        now = time.monotonic()
        await self.warmup.tick(now)
        self.verifier.check_rounds()  # a result's capped wait for earlier ones may be over
        await self.witnessing.progress()
        await self.exchange.rebroadcast(now)

    def _poke(self) -> None:
        """A Finished/witness condition or a result to verify may have changed: check now."""
        self.verifier.check_rounds()
        if self.ctx.phase == Phase.TRAINING:
            self.ctx.tasks.spawn(self.witnessing.progress())

    # ------------------------------------------------------------------ actions

    async def _do(self, action: Action, coordinator: Coordinator) -> None:
        if action == Action.WAIT:
            return
        if action == Action.LOAD_MODEL:
            if self._init_task is None:
                self._init_task = self.ctx.tasks.spawn(
                    self._initialize(coordinator), round_scoped=False
                )
        elif action == Action.START_ROUND:
            await self._start_round(coordinator)
        elif action == Action.ENTER_WITNESS:
            self._enter_witness(coordinator)
        elif action == Action.UPDATE_WITNESS:
            self.preparer.prepare(coordinator)
        elif action == Action.START_COOLDOWN:
            self.training.end_training_time()
            undo = self.preparer.abandon("the epoch ends in Cooldown")
            self.ctx.phase = Phase.COOLDOWN
            self.cooldown.start(coordinator, after=undo)
        elif action == Action.LEAVE_EPOCH:
            log.info("leaving the epoch: back to warmup", extra=self.ctx.fields())
            self._reset_to_warmup()
        else:
            log.warning(
                "desync: coordinator state %s is unexpected in phase %s; back to warmup",
                coordinator.run_state.name,
                self.ctx.phase.value,
                extra=self.ctx.fields(),
            )
            self._reset_to_warmup()
            await self._do(self._action(Phase.WARMUP, coordinator), coordinator)

    async def _initialize(self, coordinator: Coordinator) -> None:
        """Load the model (retrying, with the latest state, while it is unavailable), then
        act on the latest state."""
        newest, attempts = coordinator, 0

        def log_failure(state: RetryCallState) -> None:
            log.warning(
                "could not load the model: %s; trying again in %.0f s",
                failure(state),
                state.upcoming_sleep,
                extra=self.ctx.fields(),
            )

        async def load() -> TrainingBackend:
            nonlocal newest, attempts
            attempts += 1
            if attempts > 1:  # after a wait: the newest state
                newest = self.ctx.coordinator or newest
            log.info("loading the model for this run", extra=self.ctx.fields())
            return await self.load_backend(newest)

        loading = retrying(
            wait=doubling(self.options.load_retry_first, self.options.load_retry_max),
            retry=retry_on(lambda exc: isinstance(exc, ModelUnavailable)),
            before_sleep=log_failure,
        )
        backend = await call(loading, load)
        coordinator = newest
        self.ctx.backend = backend
        # we joined without weights (a new or restarted process): say that we hold them now
        await self.uplink.send_join()
        self.ctx.phase = Phase.WARMUP
        self.warmup.loaded_for(coordinator)
        log.info(
            "model ready",
            extra=self.ctx.fields(
                weights_hash=backend.weights_hash().hex(),
                model_source=info.kind
                if (info := backend.capabilities.model_info) is not None
                else "dummy",
            ),
        )
        latest = self.ctx.coordinator
        if latest is not None:
            await self._do(self._action(Phase.WARMUP, latest), latest)

    async def _reload_model(self, coordinator: Coordinator) -> None:
        backend = await self.load_backend(coordinator)
        async with self.ctx.model_lock:
            self.ctx.backend = backend

    async def _start_round(self, coordinator: Coordinator) -> None:
        ctx = self.ctx
        step = coordinator.progress.step
        if ctx.phase == Phase.TRAINING and ctx.current is not None and ctx.current.step == step:
            return  # an update within the round we are in
        self.training.end_training_time()
        backend = ctx.require_backend()
        height = coordinator.current_round().height
        if height == 0:  # a new epoch: nothing carries over from the last one
            ctx.current = ctx.previous = None
        prior = ctx.current  # round h−1
        have_training = coordinator.epoch_state.last_step == 0
        roles = derive_round_roles(coordinator, ctx.me, have_training)
        previous_round = coordinator.previous_round()
        witnesses = list(previous_round.witnesses) if previous_round is not None else []
        # round h−2, applied now (or prepared early) when the pipeline is full; a client out
        # of sync applies nothing until it has resynced
        full = prior is not None and prior.height > 0 and ctx.out_of_sync is None
        source = ctx.previous if full else None
        # the prepared round is handed over: adopted (and confirmed), or settled by `prelude`
        start = self.preparer.hand_off(roles, have_training, witnesses)
        prelude: asyncio.Task[bytes | None] | None
        if isinstance(start, Adopted):
            round_, prelude = start.round_, start.apply_task
        else:
            round_ = RoundState.start(
                roles, len(coordinator.epoch_state.clients), have_training, time.monotonic()
            )
            prelude = ctx.tasks.spawn(
                self.preparer.settle(start, source, witnesses, coordinator, step)
            )
        if prelude is not None:
            ctx.tasks.spawn(self._report_after(prelude, step))
        if self.joiner.active:
            self.joiner.round_started(height)
        elif self._snapshot_due(coordinator):
            ctx.tasks.spawn(self._share_after(prelude, coordinator))
        if full and prior is not None and prior.roles.is_witness:
            ctx.tasks.spawn(self.witnessing.send_health_checks(coordinator, after=prelude))
        backend.begin_round(coordinator.get_cold_start_warmup_bounds())
        ctx.previous, ctx.current = prior, round_
        ctx.phase = Phase.TRAINING
        self.warmup.reset()
        self.network.begin_step(step)
        log.info(
            "round started",
            extra=ctx.fields(
                height=height,
                batches=[str(b) for b in roles.my_batches],
                witness=roles.is_witness,
                prepared=start.label,
            ),
        )
        if isinstance(start, Adopted):
            # publishing what was held waits for every peer's ack: not on this path
            ctx.tasks.spawn(self.training.publish_held(round_))
        else:
            ctx.tasks.spawn(self.training.train(round_, prelude))
        # what was kept for this round's step is filed in it now: the round is confirmed
        # (a new one is from the start, an adopted one by the hand-off)
        self.exchange.replay_early()
        self._poke()

    def _snapshot_due(self, coordinator: Coordinator) -> bool:
        """Whether this round is a joiner's snapshot round and we are a member to share it."""
        height = coordinator.current_round().height
        return (
            self.share_snapshot is not None
            and self.ctx.me in self.ctx.members()
            and any(
                snapshot_height(j) == height and not j.ready
                for j in coordinator.epoch_state.joining
            )
        )

    async def _share_after(
        self, prelude: asyncio.Task[bytes | None] | None, coordinator: Coordinator
    ) -> None:
        """Share our weights of this round's step with its joiners, once its apply is done."""
        if prelude is not None:
            await asyncio.shield(prelude)
        if self.ctx.out_of_sync is not None or self.share_snapshot is None:
            return  # our weights are not the members'
        async with self.ctx.model_lock:
            await self.share_snapshot(coordinator, self.ctx.require_backend())

    async def _report_after(self, prelude: asyncio.Task[bytes | None], step: int) -> None:
        weights = await asyncio.shield(prelude)
        if weights is not None:
            await self.applier.report(step, weights)

    def _enter_witness(self, coordinator: Coordinator) -> None:
        self.training.end_training_time()
        self.ctx.phase = Phase.WITNESS
        round_ = self.ctx.current
        if round_ is not None and round_.roles.is_witness:
            self.ctx.tasks.spawn(self.witnessing.send_witness(round_, fallback=True))
        self.preparer.prepare(coordinator)

    def _reset_to_warmup(self) -> None:
        ctx = self.ctx
        if ctx.current is not None:
            ctx.current.stop()
        self.preparer.abandon("the epoch ended")
        ctx.tasks.cancel_round_tasks()
        ctx.current = ctx.previous = None
        ctx.phase = Phase.WARMUP if ctx.backend is not None else Phase.IDLE
        self.warmup.reset()
