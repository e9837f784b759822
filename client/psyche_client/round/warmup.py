"""Warmup (reference §2.4): telling the others that our model is ready, and the warmup witness.

While the coordinator is in Warmup, every member re-announces a warmup Finished every 2 s;
once every member has announced one, each member sends its warmup witness, which lets the
coordinator start the first round before `warmup_time` runs out. The announcements carry a
tag naming the Warmup (its start and step): ed25519 signatures are deterministic, so without
it each epoch's announcement would be byte-identical and dropped by the peers' de-duplication.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from psyche_common.committee import WitnessProof
from psyche_common.coordinator import Coordinator, RunState

from psyche_client.p2p.announcements import FinishedAnnouncement, make_finished_announcement
from psyche_client.round.context import RoundContext
from psyche_client.round.ports import PeerNetwork, Uplink, empty_witness_wire

WARMUP_TAG_DOMAIN = b"psyche-py/warmup/v1\x00"
KEPT_WARMUP_TAGS = 4
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

    def record(self, tag: bytes, sender: bytes) -> None:
        self._senders.setdefault(tag, set()).add(sender)
        while len(self._senders) > KEPT_WARMUP_TAGS:
            del self._senders[next(iter(self._senders))]

    def senders(self, tag: bytes) -> set[bytes]:
        return set(self._senders.get(tag, ()))


@dataclass
class WarmupProgress:
    """Our side of one Warmup: when we last sent our warmup Finished, and our witness."""

    sent_finished_at: float | None = None
    sent_witness: bool = False


class Warmup:
    def __init__(self, ctx: RoundContext, network: PeerNetwork, uplink: Uplink) -> None:
        self.ctx = ctx
        self.network = network
        self.uplink = uplink
        self.readiness = WarmupReadiness()
        self.progress = WarmupProgress()

    def reset(self) -> None:
        self.progress = WarmupProgress()

    def on_announcement(self, announcement: FinishedAnnouncement) -> None:
        self.readiness.record(announcement.broadcast_merkle, announcement.sender_id)

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
        progress = self.progress
        tag = warmup_tag(coordinator)
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
            await self.uplink.send_warmup_witness(empty_witness_wire(proof))
            log.info("sent warmup witness", extra=self.ctx.fields())
