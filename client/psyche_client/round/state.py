"""What a client remembers about one coordinator round.

A `RoundState` is created when a round's roles are known (at its RoundTrain, or earlier while
the previous round's witnesses report). During the round, and the next one as "previous
round", it collects the announced results per batch in arrival order, one `ResultDownload`
per announced result (its task, its outcome and the decoded result), the Finished messages,
the witness blooms, and this client's own announcements and training progress.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom

from psyche_client.p2p.announcements import FinishedAnnouncement, ResultAnnouncement
from psyche_client.round.checks import VerifierChecks
from psyche_client.round.consensus import Candidate
from psyche_client.round.link_speed import BusyMeter
from psyche_client.round.roles import RoundRoles
from psyche_client.round.witness_builder import MutableBloom, RoundWitnessState
from psyche_client.training.backend import DecodedResult, TrainedResult


def new_bloom(_num_items: int) -> Bloom:
    """A witness bloom with fresh random keys (the reference ignores the sizing hint)."""
    return Bloom.random()


class DownloadStatus(Enum):
    PENDING = "pending"
    VERIFIED = "verified"  # fetched (or our own), matched its commitment, decoded
    REJECTED = "rejected"  # bytes that do not match the signed commitment, or malformed
    FAILED = "failed"  # no peer delivered it within the attempts


@dataclass
class ResultDownload:
    """One announced result of a round and what became of it."""

    announcement: ResultAnnouncement
    batch: BatchId
    task: asyncio.Task[None] | None = None
    status: DownloadStatus = DownloadStatus.PENDING
    result: DecodedResult | None = None

    @property
    def settled(self) -> bool:
        return self.status != DownloadStatus.PENDING


Announcement = ResultAnnouncement | FinishedAnnouncement


@dataclass
class RoundState:
    roles: RoundRoles
    witness: RoundWitnessState
    have_training: bool
    candidates: dict[BatchId, list[Candidate]] = field(default_factory=dict)
    downloads: dict[bytes, ResultDownload] = field(default_factory=dict)
    finished_from: set[bytes] = field(default_factory=set)
    own_announcements: list[Announcement] = field(default_factory=list)
    held_results: list[tuple[BatchId, TrainedResult]] = field(default_factory=list)
    """Results trained before the round was confirmed (see `confirmed`), published on it."""
    confirmed: bool = True
    """False while the round is only predicted: its results are held, not published."""
    losses: list[float] = field(default_factory=list)
    tokens_trained: int = 0
    batches_done: int = 0
    training_done: bool = False
    cancelled: bool = False
    sent_finished: bool = False
    sent_witness: bool = False
    started_at: float = 0.0
    training_finished_at: float | None = None
    checks: VerifierChecks | None = None
    """Set when this client verifies the round: its recomputed references (`verifier`)."""
    fetches: BusyMeter = field(default_factory=BusyMeter)
    """Bytes and busy time of this round's result fetches (`link_speed`)."""

    @classmethod
    def start(
        cls,
        roles: RoundRoles,
        num_clients: int,
        have_training: bool,
        now: float,
        bloom_factory: Callable[[int], MutableBloom] = new_bloom,
        confirmed: bool = True,
    ) -> RoundState:
        witness = RoundWitnessState.new(roles.batch_ids, num_clients, bloom_factory)
        return cls(
            roles=roles,
            witness=witness,
            have_training=have_training,
            started_at=now,
            confirmed=confirmed,
        )

    @property
    def step(self) -> int:
        return self.roles.step

    @property
    def height(self) -> int:
        return self.roles.height

    @property
    def batches_left(self) -> int:
        return max(0, len(self.roles.my_batches) - self.batches_done)

    def downloads_settled(self) -> bool:
        """Every download of this round has finished (verified, decoded, or given up)."""
        return all(download.settled for download in self.downloads.values())

    def mean_loss(self) -> float | None:
        return sum(self.losses) / len(self.losses) if self.losses else None
