"""Warmup (reference §2.4): telling the others that our model is ready, and the warmup witness.

While the coordinator is in Warmup, every member re-announces a warmup Finished every 2 s;
once every member has announced one, each member sends its warmup witness, which lets the
coordinator start the first round before `warmup_time` runs out. The announcements carry a
tag naming the Warmup (its start and step): ed25519 signatures are deterministic, so without
it each epoch's announcement would be byte-identical and dropped by the peers' de-duplication.

A warmup Finished with the tag of the Warmup this client is in is taken. One with another tag
(a peer's announcement arriving before our own state moved on) is taken once per sender and
step, and only for this step or the next; a sender's further tags are "not now": a member's
flood of invented tags is neither recorded (it would push the real tags out) nor forwarded.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from psyche_common.announcements import FinishedAnnouncement
from psyche_common.coordinator import Coordinator, RunState
from psyche_common.coordinator.committee import WitnessProof

from psyche_client.p2p.announcements import make_finished_announcement
from psyche_client.p2p.inbox import Taken
from psyche_client.round.context import RoundContext
from psyche_client.round.ports import PeerNetwork, Uplink, WeightsCheck, empty_witness

WARMUP_TAG_DOMAIN = b"psyche-py/warmup/v1\x00"
KEPT_WARMUP_TAGS = 4
KEPT_EARLY_TAGS = 4096
"""(sender, step) pairs whose one tag other than the current Warmup's is remembered."""
REBROADCAST_INTERVAL = 2.0

log = logging.getLogger("psyche.client")


def warmup_tag(coordinator: Coordinator) -> bytes:
    """Names one Warmup: the epoch's start time and step, which every client reads alike."""
    start = int(coordinator.epoch_state.start_timestamp)
    step = int(coordinator.progress.step)
    return hashlib.sha256(
        WARMUP_TAG_DOMAIN + start.to_bytes(8, "big") + step.to_bytes(4, "big")
    ).digest()


class WarmupReadiness:
    """Who announced a finished warmup, per warmup tag (announcements may arrive early)."""

    def __init__(self) -> None:
        self._senders: dict[bytes, set[bytes]] = {}
        self._early: OrderedDict[tuple[bytes, int], bytes] = OrderedDict()
        """(sender, step) → the one tag other than the current Warmup's taken from it."""

    def offer(self, announcement: FinishedAnnouncement, coordinator: Coordinator | None) -> Taken:
        """Record a warmup Finished by the rule of the module docstring."""
        tag, sender = announcement.broadcast_merkle, announcement.sender_id
        if coordinator is None or tag != warmup_tag(coordinator):
            step = 0 if coordinator is None else int(coordinator.progress.step)
            if coordinator is not None and not step <= announcement.step <= step + 1:
                return Taken.NOT_NOW
            key = (sender, announcement.step)
            if self._early.setdefault(key, tag) != tag:
                return Taken.NOT_NOW
            while len(self._early) > KEPT_EARLY_TAGS:
                self._early.popitem(last=False)
        self.record(tag, sender)
        return Taken.ACCEPTED

    def record(self, tag: bytes, sender: bytes) -> None:
        self._senders.setdefault(tag, set()).add(sender)
        while len(self._senders) > KEPT_WARMUP_TAGS:
            del self._senders[next(iter(self._senders))]

    def senders(self, tag: bytes) -> set[bytes]:
        return set(self._senders.get(tag, ()))


@dataclass
class WarmupProgress:
    """Our side of one Warmup (`tag`): when we last sent our warmup Finished, and our
    witness."""

    tag: bytes = b""
    sent_finished_at: float | None = None
    sent_witness: bool = False


class Warmup:
    """Warmup readiness, and first the weights: a member whose model was loaded before this
    Warmup checks them against the members' majority (peer-to-peer checkpoint) or reloads the
    checkpoint (any other), before it says it is ready."""

    def __init__(
        self,
        ctx: RoundContext,
        network: PeerNetwork,
        uplink: Uplink,
        check_weights: WeightsCheck | None,
        reload_model: Callable[[Coordinator], Awaitable[None]],
    ) -> None:
        self.ctx = ctx
        self.network = network
        self.uplink = uplink
        self.check_weights = check_weights
        self.reload_model = reload_model
        self.readiness = WarmupReadiness()
        self.progress = WarmupProgress()
        self._weights_ready: set[bytes] = set()
        self._weights_task: asyncio.Task[None] | None = None

    def loaded_for(self, coordinator: Coordinator) -> None:
        """The model was just loaded for this Warmup (from its checkpoint or from peers)."""
        self._weights_ready.add(warmup_tag(coordinator))
        self.ctx.out_of_sync = None

    def _ensure_weights(self, coordinator: Coordinator, tag: bytes) -> bool:
        """True once our weights are right for this Warmup; starts the check (once)."""
        if tag in self._weights_ready:
            return True
        if self._weights_task is None or self._weights_task.done():
            self._weights_task = self.ctx.tasks.spawn(
                self._settle_weights(coordinator, tag), round_scoped=False
            )
        return False

    async def _settle_weights(self, coordinator: Coordinator, tag: bytes) -> None:
        ctx = self.ctx
        backend = ctx.require_backend()
        if not coordinator.model.checkpoint.is_p2p:
            log.info(
                "the run restarts from its %s checkpoint: reloading the model",
                coordinator.model.checkpoint.kind,
                extra=ctx.fields(),
            )
            await self.reload_model(coordinator)
            status = "reloaded"
        elif self.check_weights is None:
            status = "unchecked"
        else:
            async with ctx.model_lock:
                status = await self.check_weights(coordinator, backend)
        cause = ctx.out_of_sync
        if status == "undecided" and cause is not None:
            log.warning(
                "could not resync (no majority of members answered); still out of sync",
                extra=ctx.fields(),
            )
            return  # tried again at the next tick
        if status == "resynced":
            ctx.stats.resyncs += 1
            ctx.stats.sync_status = f"resynced at step {coordinator.progress.step}"
            log.warning(
                "weights resynced from peers",
                extra=ctx.fields(
                    cause=cause or "weights differed from the majority's",
                    weights_hash=ctx.require_backend().weights_hash().hex(),
                ),
            )
        else:
            ctx.stats.sync_status = "in sync"
        ctx.out_of_sync = None
        self._weights_ready.add(tag)

    def reset(self) -> None:
        self.progress = WarmupProgress()

    def on_announcement(
        self, announcement: FinishedAnnouncement, coordinator: Coordinator | None
    ) -> Taken:
        """A peer's warmup Finished (`WarmupReadiness.offer`)."""
        return self.readiness.offer(announcement, coordinator)

    async def tick(self, now: float) -> None:
        coordinator = self.ctx.coordinator
        if (
            coordinator is None
            or self.ctx.backend is None
            or coordinator.run_state != RunState.Warmup
        ):
            return
        members = self.ctx.members()
        if self.ctx.me not in members:
            return
        index = members.index(self.ctx.me)
        tag = warmup_tag(coordinator)
        if self.progress.tag != tag:  # a new Warmup (the last may have ended without a round)
            self.progress = WarmupProgress(tag)
        progress = self.progress
        if not self._ensure_weights(coordinator, tag):
            return
        if (
            progress.sent_finished_at is None
            or now - progress.sent_finished_at >= REBROADCAST_INTERVAL
        ):
            announcement = make_finished_announcement(
                self.ctx.identity,
                step=coordinator.progress.step,
                warmup=True,
                broadcast_merkle=tag,
            )
            self.readiness.record(tag, self.ctx.me)
            progress.sent_finished_at = now
            await self.network.announce(announcement)
        if not progress.sent_witness and set(members) <= self.readiness.senders(tag):
            progress.sent_witness = True
            proof = WitnessProof(position=index, index=index, witness=False)
            await self.uplink.send_warmup_witness(empty_witness(proof))
            log.info("sent warmup witness", extra=self.ctx.fields())
