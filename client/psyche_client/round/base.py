"""State and task bookkeeping shared by the parts of the round pipeline.

`RunnerBase` holds everything a `RoundRunner` knows (identity, network, uplink, backend, the
last coordinator state, the current and previous `RoundState`, warmup progress) and owns its
tasks: round-scoped tasks are cancelled when the pipeline resets, and the first task that fails
records the error that ends the client (`wait_fatal`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from psyche_common.client_id import short_id
from psyche_common.protocol import Identity

from psyche_client.round.ports import (
    BackendLoader,
    CooldownHook,
    DataFetcher,
    PeerNetwork,
    RunnerOptions,
    Uplink,
    run_state_name,
)
from psyche_client.round.state import RoundState
from psyche_client.stats import ClientStats
from psyche_client.training.backend import TrainingBackend

log = logging.getLogger("psyche.client")


@dataclass
class WarmupProgress:
    """Our side of one Warmup: when we last sent our warmup Finished, and our witness."""

    sent_finished_at: float | None = None
    sent_witness: bool = False


WARMUP_TAG_DOMAIN = b"psyche-py/warmup/v1\x00"
KEPT_WARMUP_TAGS = 4


def warmup_tag(coordinator: Any) -> bytes:
    """Names one Warmup: the epoch's start time and step, which every client reads alike.

    Warmup Finished announcements carry it (as their Merkle root) so that each epoch's
    announcement differs: ed25519 signatures are deterministic, and an identical message
    would be dropped by the peers' de-duplication in every epoch after the first.
    """
    start = int(coordinator.epoch_state.start_timestamp)
    step = int(coordinator.progress.step)
    return hashlib.sha256(
        WARMUP_TAG_DOMAIN + start.to_bytes(8, "big") + step.to_bytes(4, "big")
    ).digest()


class WarmupReadiness:
    """Who announced a finished warmup, per warmup tag (announcements may arrive early)."""

    def __init__(self) -> None:
        self._senders: dict[bytes, set[bytes]] = {}

    def record(self, tag: bytes, sender: bytes) -> None:
        self._senders.setdefault(tag, set()).add(sender)
        while len(self._senders) > KEPT_WARMUP_TAGS:
            del self._senders[next(iter(self._senders))]

    def senders(self, tag: bytes) -> set[bytes]:
        return set(self._senders.get(tag, ()))


class RunnerBase:
    """Shared state of the pipeline (see `RoundRunner`)."""

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
        self.warmup = WarmupProgress()
        self.warmup_ready = WarmupReadiness()
        self._rejoined_for: tuple[int, int] | None = None  # the dropped record we re-joined for
        self.fatal: BaseException | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._round_tasks: set[asyncio.Task[Any]] = set()
        self._init_task: asyncio.Task[None] | None = None
        self._model_lock = asyncio.Lock()
        self._early: list[Any] = []
        self._last_rebroadcast = 0.0
        self._fatal_event = asyncio.Event()

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
        fields: dict[str, Any] = {"client_id": short_id(self.me)}
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

    def _round_for_step(self, step: int) -> RoundState | None:
        for round_ in (self.current, self.previous):
            if round_ is not None and round_.step == step:
                return round_
        return None

    async def aclose(self) -> None:
        tasks = [*self._round_tasks, *self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _cancel_round_tasks(self) -> None:
        for task in list(self._round_tasks):
            task.cancel()
