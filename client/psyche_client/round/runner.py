"""The client's round pipeline: reacts to coordinator states and peer announcements.

This is the asyncio state machine of reference §2.2–2.15. It never blocks the event loop:
training, decoding and applying run in worker threads (`asyncio.to_thread`) serialized by one
model lock, downloads and fetches are tasks with timeouts. Transport is abstracted behind
`PeerNetwork` (P2P node) and `Uplink` (the server connection), the model behind
`TrainingBackend`, so the whole pipeline runs in-process in tests.

Lifecycle: an initial Warmup that lists us starts `load_backend` (model from the checkpoint
the coordinator names, or peer-to-peer). Then per round: apply round h−2's consensus results,
send health checks, derive roles and batches, fetch data, train, publish; download peers'
results, fill blooms, send Finished and the (opportunistic) witness; at Cooldown save/share
the model. See docs/client.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from psyche_common.assignment import BatchId
from psyche_common.committee import WitnessProof
from psyche_common.coordinator import ClientState

from psyche_client.p2p.announcements import (
    make_finished_announcement,
)
from psyche_client.round.apply import ApplyAndWitness
from psyche_client.round.base import WarmupProgress, warmup_tag
from psyche_client.round.exchange import ResultExchange
from psyche_client.round.ports import empty_witness_wire, run_state_name
from psyche_client.round.roles import derive_round_roles
from psyche_client.round.state import RoundState

DATA_FETCH_ATTEMPTS = 7
WARMUP_REBROADCAST_INTERVAL = 2.0

log = logging.getLogger("psyche.client")

DROPPED_STATES = frozenset({ClientState.Dropped, ClientState.Ejected})


class RoundRunner(ResultExchange, ApplyAndWitness):
    """One client's pipeline; feed it `on_state`, `on_announcement` and `tick` (every 0.5 s)."""

    async def on_state(self, coordinator: Any) -> None:
        """A new coordinator state arrived from the server (already de-duplicated)."""
        self.coordinator = coordinator
        state = run_state_name(coordinator)
        self.stats.observe_state(coordinator)
        if self.backend is None:
            if state == "Warmup" and self._in_clients(coordinator) and self._init_task is None:
                self._init_task = self._spawn(self._initialize(coordinator), round_scoped=False)
            return
        await self._rejoin_if_dropped(coordinator)
        if not self._in_clients(coordinator):
            if self.active in ("training", "witness", "cooldown"):
                log.warning("no longer in the client list: back to warmup", extra=self._fields())
            self._reset_to_warmup()
            return
        await self._transition(coordinator, state)

    async def _rejoin_if_dropped(self, coordinator: Any) -> None:
        """A health check dropped us (our exited record says so): join again, once per
        record, so that we are in the next epoch instead of idling for good."""
        record = next(
            (
                c
                for c in coordinator.epoch_state.exited_clients
                if c.id == self.me and c.state in DROPPED_STATES
            ),
            None,
        )
        if record is None:
            return
        key = (int(coordinator.epoch_state.start_timestamp), int(record.exited_height))
        if key == self._rejoined_for:
            return
        self._rejoined_for = key
        log.warning(
            "dropped from the epoch by a health check: joining again for the next epoch",
            extra=self._fields(),
        )
        await self.uplink.send_join()

    async def _transition(self, coordinator: Any, state: str) -> None:
        step = coordinator.progress.step
        if state == "RoundTrain":
            if self.active != "training" or self.current is None or self.current.step != step:
                if self.active == "training" and self.current is not None:
                    self._finish_training(self.current)
                self._start_round(coordinator)
        elif state == "RoundWitness":
            if self.active == "training" and self.current is not None:
                self._finish_training(self.current)
                self._start_witness()
            elif self.active not in ("witness",):
                log.info(
                    "round in progress when we became ready: waiting for the next round",
                    extra=self._fields(),
                )
        elif state == "Cooldown":
            if self.active in ("training", "witness"):
                if self.active == "training" and self.current is not None:
                    self._finish_training(self.current)
                self._start_cooldown(coordinator)
        elif state in ("WaitingForMembers", "Warmup", "Paused", "Finished") and (
            self.active != "warmup"
        ):
            self._reset_to_warmup()

    def _reset_to_warmup(self) -> None:
        if self.current is not None and not self.current.training_done and self.backend:
            self.current.cancelled = True
        self._cancel_round_tasks()
        self.current = None
        self.previous = None
        self.active = "warmup"
        self.warmup = WarmupProgress()

    async def _initialize(self, coordinator: Any) -> None:
        log.info("loading the model for this run", extra=self._fields())
        backend = await self.load_backend(coordinator)
        self.backend = backend
        self.active = "warmup"
        log.info(
            "model ready",
            extra=self._fields(
                weights_hash=backend.weights_hash().hex(),
                model_source=getattr(getattr(backend, "info", None), "kind", "dummy"),
            ),
        )
        if self.coordinator is not None and self._in_clients(self.coordinator):
            await self._transition(self.coordinator, run_state_name(self.coordinator))

    async def _warmup_tick(self, now: float) -> None:
        coordinator = self.coordinator
        if self.backend is None or run_state_name(coordinator) != "Warmup":
            return
        index = next(
            (i for i, c in enumerate(coordinator.epoch_state.clients) if c.id == self.me), None
        )
        if index is None:
            return
        progress = self.warmup
        tag = warmup_tag(coordinator)
        if (
            progress.sent_finished_at is None
            or now - progress.sent_finished_at >= WARMUP_REBROADCAST_INTERVAL
        ):
            announcement = make_finished_announcement(
                self.identity,
                step=coordinator.progress.step,
                warmup=True,
                broadcast_merkle=tag,
            )
            self.warmup_ready.record(tag, self.me)
            progress.sent_finished_at = now
            await self.network.announce(announcement)
        if not progress.sent_witness and set(self._client_ids()) <= self.warmup_ready.senders(tag):
            progress.sent_witness = True
            proof = WitnessProof(position=index, index=index, witness=False)
            await self.uplink.send_warmup_witness(empty_witness_wire(proof))
            log.info("sent warmup witness", extra=self._fields())

    def _start_round(self, coordinator: Any) -> None:
        assert self.backend is not None
        step = coordinator.progress.step
        height = coordinator.current_round().height
        if height == 0:  # a new epoch: nothing carries over from the last one
            self.current = self.previous = None
        apply_task: asyncio.Task[None] | None = None
        prior = self.current  # round h−1
        if prior is not None and prior.height > 0 and self.previous is not None:
            apply_task = self._spawn(self._apply(self.previous, coordinator, step))
        if prior is not None and prior.height > 0 and prior.roles.is_witness:
            self._spawn(self._send_health_checks(coordinator))
        self.backend.begin_round(coordinator)
        have_training = coordinator.epoch_state.last_step == 0
        roles = derive_round_roles(coordinator, self.me, have_training)
        self.previous = prior
        self.current = RoundState.start(
            roles, len(coordinator.epoch_state.clients), have_training, time.monotonic()
        )
        self.active = "training"
        self.warmup = WarmupProgress()
        self.network.begin_step(step)
        log.info(
            "round started",
            extra=self._fields(
                height=height,
                batches=[str(b) for b in roles.my_batches],
                witness=roles.is_witness,
            ),
        )
        self._spawn(self._train(self.current, apply_task))
        early, self._early = self._early, []
        for announcement in early:
            self._route(announcement)

    async def _train(self, round_: RoundState, apply_task: asyncio.Task[None] | None) -> None:
        assert self.backend is not None
        if apply_task is not None:
            await apply_task
        if round_.have_training:
            for batch in round_.roles.my_batches:
                if round_.cancelled:
                    break
                samples = await self._fetch(batch) if self.options.needs_data else None
                if self.options.needs_data and samples is None:
                    continue
                async with self._model_lock:
                    if round_.cancelled:
                        break
                    output = await asyncio.to_thread(
                        self.backend.train,
                        round_.step,
                        batch,
                        samples,
                        lambda: round_.cancelled,
                    )
                    if output is None or round_.cancelled:
                        if output is not None:
                            await asyncio.to_thread(self.backend.cancel_round)
                        log.warning(
                            "training cut short by the witness phase: result dropped",
                            extra=self._fields(),
                        )
                        break
                round_.losses.append(output.loss)
                round_.tokens_trained += output.tokens
                round_.self_results.append(output.local_result)
                await self._publish(round_, batch, output)
        round_.training_done = True
        round_.training_finished_at = time.monotonic()
        self._poke()
        loss = round_.mean_loss()
        log.info(
            "trained step" if round_.losses else "round without training",
            extra=self._fields(
                step=round_.step,
                loss=loss,
                weights_hash=self.backend.weights_hash().hex(),
                batches=len(round_.losses),
            ),
        )

    async def _fetch(self, batch: BatchId) -> Any:
        assert self.fetch_samples is not None
        for attempt in range(1, DATA_FETCH_ATTEMPTS + 1):
            try:
                return await self.fetch_samples(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "data fetch for %s failed (attempt %d/%d): %s",
                    batch,
                    attempt,
                    DATA_FETCH_ATTEMPTS,
                    exc,
                    extra=self._fields(),
                )
                await asyncio.sleep(self.options.fetch_retry_delay * attempt)
        log.error("giving up on %s: it will not be trained", batch, extra=self._fields())
        return None

    def _finish_training(self, round_: RoundState) -> None:
        if not round_.training_done:
            round_.cancelled = True
        self.stats.round_finished(round_)

    def _start_witness(self) -> None:
        self.active = "witness"
        round_ = self.current
        if round_ is not None and round_.roles.is_witness:
            self._spawn(self._send_witness(round_, fallback=True))

    async def tick(self) -> None:
        """The 500 ms timer: warmup readiness, Finished + opportunistic witness, rebroadcast."""
        if self.coordinator is None or self.backend is None:
            return
        now = time.monotonic()
        await self._warmup_tick(now)
        await self._training_tick()
        await self._rebroadcast(now)

    def _start_cooldown(self, coordinator: Any) -> None:
        self.active = "cooldown"
        if self.on_cooldown is not None and self.backend is not None:
            self._spawn(self._cooldown(coordinator), round_scoped=False)

    async def _cooldown(self, coordinator: Any) -> None:
        assert self.backend is not None and self.on_cooldown is not None
        async with self._model_lock:
            await self.on_cooldown(coordinator, self.backend)
