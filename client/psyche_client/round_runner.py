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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from psyche_common.assignment import BatchId
from psyche_common.bloom import Bloom
from psyche_common.committee import Committee, WitnessProof
from psyche_common.coordinator.quorum import witness_quorum
from psyche_common.protocol import Identity

from psyche_client.backend import TrainingBackend
from psyche_client.consensus import Candidate, plan_apply
from psyche_client.health import clients_to_accuse
from psyche_client.p2p.announcements import (
    AnnouncementError,
    FinishedAnnouncement,
    ResultAnnouncement,
    make_finished_announcement,
    make_result_announcement,
    verify_announcement,
)
from psyche_client.roles import derive_round_roles, selection_for_round
from psyche_client.round_state import RoundState
from psyche_client.stats import ClientStats
from psyche_client.witness_builder import EMPTY_MERKLE_ROOT, merkle_root

log = logging.getLogger("psyche.client")

TICK_INTERVAL = 0.5
DOWNLOAD_RETRIES = 3
DATA_FETCH_ATTEMPTS = 7
REBROADCAST_INTERVAL = 10.0
WARMUP_REBROADCAST_INTERVAL = 2.0
MAX_EARLY_ANNOUNCEMENTS = 4096


class DesyncError(RuntimeError):
    """This client can no longer follow the run with the same weights as its peers."""


class PeerNetwork(Protocol):
    """The P2P node as the pipeline uses it."""

    async def announce(self, announcement: Any) -> None: ...

    def publish_blob(self, data: bytes, step: int) -> bytes: ...

    async def fetch_blob(
        self, blob_hash: bytes, size: int, providers: Sequence[bytes]
    ) -> bytes: ...

    def begin_step(self, step: int) -> None:
        """A round of ``step`` starts: count traffic against it, drop blobs before step − 2."""
        ...


class Uplink(Protocol):
    """The server connection as the pipeline uses it."""

    async def send_witness(self, witness: dict[str, Any], metadata: dict[str, Any]) -> None: ...

    async def send_warmup_witness(self, witness: dict[str, Any]) -> None: ...

    async def send_health_check(
        self, checks: list[tuple[bytes, dict[str, Any]]], step: int, weights_hash: bytes
    ) -> None: ...

    async def send_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...


DataFetcher = Callable[[BatchId], Awaitable[Any]]
BackendLoader = Callable[[Any], Awaitable[TrainingBackend]]
CooldownHook = Callable[[Any, TrainingBackend], Awaitable[None]]


@dataclass
class RunnerOptions:
    run_id: str
    fetch_retry_delay: float = 2.0
    download_backoff: float = 2.0
    write_gradients_dir: Path | None = None
    needs_data: bool = True


def run_state_name(coordinator: Any) -> str:
    """The run state as its wire text (``"RoundTrain"``), for a StrEnum or a plain string."""
    state = coordinator.run_state
    return str(state)


def empty_witness_wire(proof: WitnessProof, merkle: bytes = EMPTY_MERKLE_ROOT) -> dict[str, Any]:
    return witness_wire(proof, Bloom(), Bloom(), merkle)


def witness_wire(
    proof: WitnessProof, participant: Bloom, broadcast: Bloom, merkle: bytes
) -> dict[str, Any]:
    return {
        "proof": proof.to_wire(),
        "participant_bloom": participant.to_wire(),
        "broadcast_bloom": broadcast.to_wire(),
        "broadcast_merkle": merkle,
    }


@dataclass
class _WarmupProgress:
    finished_from: set[bytes] = field(default_factory=set)
    sent_finished_at: float | None = None
    sent_witness: bool = False


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
    ) -> None:
        self.identity = identity
        self.me = identity.public_key
        self.network = network
        self.uplink = uplink
        self.load_backend = load_backend
        self.fetch_samples = fetch_samples
        self.options = options
        self.on_cooldown = on_cooldown
        self.stats = stats or ClientStats()
        self.backend: TrainingBackend | None = None
        self.coordinator: Any = None
        self.active = "idle"  # idle | warmup | training | witness | cooldown
        self.current: RoundState | None = None
        self.previous: RoundState | None = None
        self.warmup = _WarmupProgress()
        self.fatal: BaseException | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._round_tasks: set[asyncio.Task[Any]] = set()
        self._init_task: asyncio.Task[None] | None = None
        self._model_lock = asyncio.Lock()
        self._early: list[Any] = []
        self._last_rebroadcast = 0.0
        self._fatal_event = asyncio.Event()

    # ------------------------------------------------------------------ helpers

    def _spawn(self, coro: Awaitable[Any], round_scoped: bool = True) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        bucket = self._round_tasks if round_scoped else self._tasks
        bucket.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._round_tasks.discard(task)
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self.fatal is None:
            log.error("client task failed: %s", exc, exc_info=exc, extra=self._fields())
            self.fatal = exc
            self._fatal_event.set()

    async def wait_fatal(self) -> BaseException:
        await self._fatal_event.wait()
        assert self.fatal is not None
        return self.fatal

    def _fields(self, **extra: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {"client_id": self.me[:4].hex()}
        if self.coordinator is not None:
            fields.update(
                epoch=self.coordinator.progress.epoch,
                step=self.coordinator.progress.step,
                state=run_state_name(self.coordinator),
            )
        fields.update(extra)
        return fields

    def _client_ids(self) -> list[bytes]:
        return [c.id for c in self.coordinator.epoch_state.clients]

    def _in_clients(self, coordinator: Any) -> bool:
        return any(c.id == self.me for c in coordinator.epoch_state.clients)

    async def aclose(self) -> None:
        tasks = [*self._round_tasks, *self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _cancel_round_tasks(self) -> None:
        for task in list(self._round_tasks):
            task.cancel()

    # ------------------------------------------------------------------ coordinator states

    async def on_state(self, coordinator: Any) -> None:
        """A new coordinator state arrived from the server (already de-duplicated)."""
        self.coordinator = coordinator
        state = run_state_name(coordinator)
        self.stats.observe_state(coordinator)
        if self.backend is None:
            if state == "Warmup" and self._in_clients(coordinator) and self._init_task is None:
                self._init_task = self._spawn(self._initialize(coordinator), round_scoped=False)
            return
        if not self._in_clients(coordinator):
            if self.active in ("training", "witness", "cooldown"):
                log.warning("no longer in the client list: back to warmup", extra=self._fields())
            self._reset_to_warmup()
            return
        await self._transition(coordinator, state)

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
        self.warmup = _WarmupProgress()

    async def _initialize(self, coordinator: Any) -> None:
        log.info("loading the model for this run", extra=self._fields())
        backend = await self.load_backend(coordinator)
        self.backend = backend
        self.active = "warmup"
        log.info(
            "model ready",
            extra=self._fields(weights_hash=backend.weights_hash().hex()),
        )
        if self.coordinator is not None and self._in_clients(self.coordinator):
            await self._transition(self.coordinator, run_state_name(self.coordinator))

    # ------------------------------------------------------------------ warmup

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
        if (
            progress.sent_finished_at is None
            or now - progress.sent_finished_at >= WARMUP_REBROADCAST_INTERVAL
        ):
            announcement = make_finished_announcement(
                self.identity, step=0, warmup=True, broadcast_merkle=EMPTY_MERKLE_ROOT
            )
            progress.finished_from.add(self.me)
            progress.sent_finished_at = now
            await self.network.announce(announcement)
        if not progress.sent_witness and set(self._client_ids()) <= progress.finished_from:
            progress.sent_witness = True
            proof = WitnessProof(position=index, index=index, witness=False)
            await self.uplink.send_warmup_witness(empty_witness_wire(proof))
            log.info("sent warmup witness", extra=self._fields())

    # ------------------------------------------------------------------ rounds

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
            self._spawn(self._send_health_checks(prior, coordinator))
        self.backend.begin_round(coordinator)
        have_training = coordinator.epoch_state.last_step == 0
        roles = derive_round_roles(coordinator, self.me, have_training)
        self.previous = prior
        self.current = RoundState.start(
            roles, len(coordinator.epoch_state.clients), have_training, time.monotonic()
        )
        self.active = "training"
        self.warmup = _WarmupProgress()
        self.network.begin_step(step)
        self.stats.round_started(step)
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

    async def _publish(self, round_: RoundState, batch: BatchId, output: Any) -> None:
        blob_hash = self.network.publish_blob(output.payload, round_.step)
        announcement = make_result_announcement(
            self.identity,
            step=round_.step,
            batch_start=batch.start,
            batch_end=batch.end,
            data_hash=output.data_hash,
            blob_hash=blob_hash,
            size=len(output.payload),
        )
        if self.options.write_gradients_dir is not None:
            directory = self.options.write_gradients_dir
            name = (
                f"result-{self.me[:4].hex()}-step{round_.step}-batch{batch.start}-{batch.end}.bin"
            )
            await asyncio.to_thread(_write_file, directory / name, output.payload)
        round_.own_announcements.append(announcement)
        self._accept_result(round_, announcement, own_payload=output.payload)
        await self.network.announce(announcement)

    def _finish_training(self, round_: RoundState) -> None:
        if not round_.training_done:
            round_.cancelled = True
        self.stats.round_finished(round_, self.coordinator)

    def _start_witness(self) -> None:
        self.active = "witness"
        round_ = self.current
        if round_ is not None and round_.roles.is_witness:
            self._spawn(self._send_witness(round_, fallback=True))

    # ------------------------------------------------------------------ announcements

    def on_announcement(self, announcement: Any) -> None:
        """A verified-or-not announcement arrived from a peer (or was re-broadcast)."""
        try:
            verify_announcement(announcement)
        except AnnouncementError as exc:
            log.warning("dropped announcement: %s", exc, extra=self._fields())
            return
        if isinstance(announcement, FinishedAnnouncement) and announcement.warmup:
            self.warmup.finished_from.add(announcement.sender_id)
            return
        if self.backend is None or self.coordinator is None:
            return
        self._route(announcement)

    def _route(self, announcement: Any) -> None:
        if announcement.sender_id not in self._client_ids():
            return
        round_ = self._round_for_step(announcement.step)
        if round_ is None:
            current_step = self.current.step if self.current else 0
            if announcement.step > current_step and len(self._early) < MAX_EARLY_ANNOUNCEMENTS:
                self._early.append(announcement)
            return
        if isinstance(announcement, ResultAnnouncement):
            if announcement.sender_id != self.me:
                self._accept_result(round_, announcement)
        else:
            if announcement.sender_id not in round_.finished_from:
                round_.finished_from.add(announcement.sender_id)
                round_.witness.record_announcement(announcement.data_hash)
                self._poke()

    def _round_for_step(self, step: int) -> RoundState | None:
        for round_ in (self.current, self.previous):
            if round_ is not None and round_.step == step:
                return round_
        return None

    def _accept_result(
        self, round_: RoundState, announcement: ResultAnnouncement, own_payload: bytes | None = None
    ) -> None:
        batch = BatchId(announcement.batch_start, announcement.batch_end)
        owner = round_.roles.assignments.get(batch)
        if owner is None:
            log.warning(
                "result for %s is not a batch of step %d", batch, round_.step, extra=self._fields()
            )
            return
        if owner != announcement.sender_id:
            log.warning(
                "result for %s from %s, which is not its trainer",
                batch,
                announcement.sender_id[:4].hex(),
                extra=self._fields(),
            )
            return
        if not self._sender_is_trainer(round_, announcement.sender_id):
            return
        if announcement.data_hash in round_.announcements:
            return
        round_.announcements[announcement.data_hash] = announcement
        round_.candidates.setdefault(batch, []).append(
            Candidate(announcement.sender_id, announcement.data_hash)
        )
        round_.witness.record_announcement(announcement.data_hash)
        self.stats.result_announced()
        round_.downloads[announcement.data_hash] = self._spawn(
            self._download(round_, announcement, batch, own_payload)
        )

    def _sender_is_trainer(self, round_: RoundState, sender: bytes) -> bool:
        selection = round_.roles.selection
        ids = self._client_ids()
        if selection is None or sender not in ids:
            return False
        index = ids.index(sender)
        return index < selection.total_nodes and (
            selection.get_committee(index).committee == Committee.Trainer
        )

    async def _download(
        self,
        round_: RoundState,
        announcement: ResultAnnouncement,
        batch: BatchId,
        own_payload: bytes | None,
    ) -> None:
        assert self.backend is not None
        for attempt in range(DOWNLOAD_RETRIES + 1):
            try:
                if own_payload is not None:
                    payload = own_payload
                else:
                    providers = [announcement.sender_id] + [
                        peer
                        for peer in self._client_ids()
                        if peer not in (announcement.sender_id, self.me)
                    ]
                    payload = await self.network.fetch_blob(
                        announcement.blob_hash, announcement.size, providers
                    )
                    self.stats.downloaded(len(payload))
                decoded = await asyncio.to_thread(
                    self.backend.decode, round_.step, batch, payload, announcement.data_hash
                )
            except asyncio.CancelledError:
                raise
            except ValueError as exc:
                log.warning(
                    "result for %s from %s rejected: %s",
                    batch,
                    announcement.sender_id[:4].hex(),
                    exc,
                    extra=self._fields(),
                )
                round_.failed.add(announcement.data_hash)
                return
            except Exception as exc:
                delay = self.options.download_backoff * 2**attempt
                log.warning(
                    "download of %s from %s failed (%s); retry in %.0fs",
                    batch,
                    announcement.sender_id[:4].hex(),
                    exc,
                    delay,
                    extra=self._fields(),
                )
                if attempt < DOWNLOAD_RETRIES:
                    await asyncio.sleep(delay)
                continue
            round_.witness.record_verified(announcement.sender_id, batch, announcement.data_hash)
            round_.payloads[announcement.data_hash] = decoded
            self._poke()
            return
        log.warning("giving up on the result for %s", batch, extra=self._fields())
        round_.failed.add(announcement.data_hash)

    # ------------------------------------------------------------------ apply, witness, health

    async def _apply(self, source: RoundState, coordinator: Any, step: int) -> None:
        assert self.backend is not None
        previous_round = coordinator.previous_round()
        witnesses = list(previous_round.witnesses) if previous_round is not None else []
        quorum = witness_quorum(coordinator.config.witness_nodes, len(witnesses))
        plan = plan_apply(
            source.roles.batch_ids,
            source.candidates,
            [w.broadcast_bloom for w in witnesses],
            quorum,
        )
        for batch, reason in plan.skipped:
            log.warning(
                "not applying %s of step %d: %s",
                batch,
                source.step,
                reason.value,
                extra=self._fields(),
            )
        results = []
        cold_start_steps = _cold_start_filter(coordinator)
        for batch, candidate in plan.apply:
            task = source.downloads.get(candidate.data_hash)
            if task is not None and not task.done():
                await asyncio.shield(task)
            payload = source.payloads.get(candidate.data_hash)
            if payload is None:
                raise DesyncError(
                    f"the consensus result for {batch} of step {source.step} (from "
                    f"{candidate.sender[:4].hex()}) could not be downloaded and verified; "
                    "this client's weights would differ from its peers'"
                )
            nonce = getattr(payload, "trainer_nonce", None)
            if nonce is not None and nonce < cold_start_steps:
                log.info(
                    "not applying %s of step %d: its trainer is in its cold start (nonce %d < %d)",
                    batch,
                    source.step,
                    nonce,
                    cold_start_steps,
                    extra=self._fields(),
                )
                continue
            results.append(payload)
            self.stats.applied_senders.add(candidate.sender)
        if results:
            async with self._model_lock:
                await asyncio.to_thread(self.backend.apply, step, results)
        else:
            log.warning("no results to apply for step %d", source.step, extra=self._fields())
        weights = self.backend.weights_hash()
        self.stats.applied(step, weights)
        log.info(
            "applied step",
            extra=self._fields(
                step=step,
                applied_from_step=source.step,
                results=len(results),
                weights_hash=weights.hex(),
            ),
        )
        await self.uplink.send_health_check([], step, weights)

    async def _send_health_checks(self, prior: RoundState, coordinator: Any) -> None:
        previous_round = coordinator.previous_round()
        selection = selection_for_round(coordinator, previous_round)
        if previous_round is None or selection is None or coordinator.current_round().height < 2:
            return
        witnesses = list(previous_round.witnesses)
        quorum = witness_quorum(coordinator.config.witness_nodes, len(witnesses))
        ids = [c.id for c in coordinator.epoch_state.clients][: selection.total_nodes]
        accused = clients_to_accuse(
            ids,
            is_trainer=lambda i: selection.get_committee(i).committee == Committee.Trainer,
            participant_blooms=[w.participant_bloom for w in witnesses],
            quorum=quorum,
            proof_for=lambda i: selection.get_committee(i).to_wire(),
        )
        if accused:
            assert self.backend is not None
            log.warning(
                "health check: accusing %s",
                [client_id[:4].hex() for client_id, _ in accused],
                extra=self._fields(),
            )
            await self.uplink.send_health_check(
                accused, coordinator.progress.step, self.backend.weights_hash()
            )

    async def _send_witness(self, round_: RoundState, fallback: bool) -> None:
        """Send this round's witness (it attests the previous round's results) at most once."""
        proof = round_.roles.witness_proof
        if proof is None or not round_.roles.is_witness or round_.sent_witness:
            return
        round_.sent_witness = True
        previous = self.previous
        if previous is not None:
            participant = previous.witness.participant_bloom
            broadcast = previous.witness.broadcast_bloom
            merkle = previous.witness.merkle()
        else:
            participant, broadcast, merkle = Bloom(), Bloom(), EMPTY_MERKLE_ROOT
        assert self.backend is not None
        metadata = self.stats.witness_metadata(round_.step, self.backend.weights_hash())
        await self.uplink.send_witness(
            witness_wire(proof, participant, broadcast, merkle), metadata
        )
        log.info("sent witness", extra=self._fields(fallback=fallback))

    def _poke(self) -> None:
        """Something the Finished/witness conditions depend on changed: check them now rather
        than at the next 500 ms tick (saves up to half a second per round)."""
        if self.active == "training":
            self._spawn(self._training_tick())

    async def _training_tick(self) -> None:
        round_ = self.current
        if round_ is None or self.active != "training" or not round_.training_done:
            return
        previous = self.previous
        if previous is not None and not (
            previous.witness.all_batches_seen and previous.downloads_settled()
        ):
            return
        if not round_.sent_finished:
            round_.sent_finished = True
            merkle = previous.witness.merkle() if previous is not None else EMPTY_MERKLE_ROOT
            announcement = make_finished_announcement(
                self.identity, step=round_.step, warmup=False, broadcast_merkle=merkle
            )
            round_.own_announcements.append(announcement)
            self._route(announcement)
            await self.network.announce(announcement)
        if set(self._client_ids()) <= round_.finished_from and round_.roles.is_witness:
            await self._send_witness(round_, fallback=False)

    async def _rebroadcast(self, now: float) -> None:
        if now - self._last_rebroadcast < REBROADCAST_INTERVAL:
            return
        self._last_rebroadcast = now
        for round_ in (self.previous, self.current):
            if round_ is None:
                continue
            for announcement in round_.own_announcements:
                await self.network.announce(announcement)

    async def tick(self) -> None:
        """The 500 ms timer: warmup readiness, Finished + opportunistic witness, rebroadcast."""
        if self.coordinator is None or self.backend is None:
            return
        now = time.monotonic()
        await self._warmup_tick(now)
        await self._training_tick()
        await self._rebroadcast(now)

    # ------------------------------------------------------------------ cooldown

    def _start_cooldown(self, coordinator: Any) -> None:
        self.active = "cooldown"
        if self.on_cooldown is not None and self.backend is not None:
            self._spawn(self._cooldown(coordinator), round_scoped=False)

    async def _cooldown(self, coordinator: Any) -> None:
        assert self.backend is not None and self.on_cooldown is not None
        async with self._model_lock:
            await self.on_cooldown(coordinator, self.backend)


def _cold_start_filter(coordinator: Any) -> int:
    """Results whose trainer nonce is below this are skipped (P2P checkpoints only, §2.9)."""
    checkpoint = coordinator.model.checkpoint
    if getattr(checkpoint, "kind", "") in ("P2P", "P2PGcs"):
        return int(coordinator.model.cold_start_warmup_steps)
    return 0


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def merkle_of(announcements: Sequence[Any]) -> bytes:
    return merkle_root([a.data_hash for a in announcements])
