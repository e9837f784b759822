"""What a client remembers about one coordinator round.

A `RoundState` is created when a round's roles are known (at its RoundTrain, or earlier while
the previous round's witnesses report). During the round, and the next one as "previous
round", it collects the announced results per batch in arrival order, one `ResultDownload`
per announced result (its task, its outcome and the decoded result), the Finished messages,
the witness blooms, and this client's own announcements and training progress. Where the
round is in its life is one `RoundStage`, moved only forward by the round's methods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from psyche_common.announcements import FinishedAnnouncement, ResultAnnouncement
from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom

from psyche_client.round.checks import VerifierChecks
from psyche_client.round.consensus import Candidate
from psyche_client.round.link_speed import BusyMeter
from psyche_client.round.roles import RoundRoles
from psyche_client.round.witness_builder import RoundWitnessState
from psyche_client.training.backend import DecodedResult, TrainedResult


def new_bloom(_num_items: int) -> Bloom:
    """A witness bloom with fresh random keys (the reference ignores the sizing hint)."""
    return Bloom.random()


class RoundStage(Enum):
    """Where a round is in its life (this client's side of it).

    PREDICTED → TRAINING → TRAINED → FINISHED, or → CANCELLED from any of them. A prepared
    round starts PREDICTED and is confirmed (`confirm`) when it is adopted; every other round
    starts TRAINING.
    """

    PREDICTED = "predicted"
    """Known early, while the previous round's witnesses report: its results are held, and
    announcements for its step are kept aside until it is confirmed."""
    TRAINING = "training"
    """Confirmed: its results are published as they are trained."""
    TRAINED = "trained"
    """This client's training of the round is over: its Finished may go out."""
    FINISHED = "finished"
    """Its Finished was announced."""
    CANCELLED = "cancelled"
    """Stopped before its training was over (its training time ended, or the prediction was
    discarded), or the client lost sync: it trains, publishes and verifies nothing more."""


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
    """Results trained while the round was PREDICTED, published when it is confirmed."""
    stage: RoundStage = RoundStage.TRAINING
    losses: list[float] = field(default_factory=list)
    tokens_trained: int = 0
    samples_trained: int = 0
    batches_done: int = 0
    sent_witness: bool = False
    """A witness of the round sends its witness once. Not a stage: the witness reports what
    this client saw of the previous round, however far its own training got."""
    started_at: float = 0.0
    training_finished_at: float | None = None
    """When this client's training of the round ended (stopped or not); None while it runs."""
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
        bloom_factory: Callable[[int], Bloom] = new_bloom,
        predicted: bool = False,
    ) -> RoundState:
        witness = RoundWitnessState.new(roles.batch_ids, num_clients, bloom_factory)
        return cls(
            roles=roles,
            witness=witness,
            have_training=have_training,
            started_at=now,
            stage=RoundStage.PREDICTED if predicted else RoundStage.TRAINING,
        )

    @property
    def step(self) -> int:
        return self.roles.step

    @property
    def height(self) -> int:
        return self.roles.height

    @property
    def confirmed(self) -> bool:
        """Not (or no longer) only predicted: announcements for its step are filed in it."""
        return self.stage is not RoundStage.PREDICTED

    @property
    def cancelled(self) -> bool:
        return self.stage is RoundStage.CANCELLED

    @property
    def training_done(self) -> bool:
        """This client's training of the round has ended (stopped or not)."""
        return self.training_finished_at is not None

    def confirm(self) -> None:
        """The predicted round really started: its results are published from now on (the
        held ones by the caller)."""
        if self.stage is not RoundStage.PREDICTED:
            raise RuntimeError(f"step {self.step}: only a predicted round is confirmed")
        self.stage = RoundStage.TRAINED if self.training_done else RoundStage.TRAINING

    def end_training(self, now: float) -> None:
        """This client's training of the round ended (all batches, or stopped)."""
        self.training_finished_at = now
        if self.stage is RoundStage.TRAINING:
            self.stage = RoundStage.TRAINED

    def mark_finished(self) -> None:
        """Finished is being announced for this round."""
        if self.stage is not RoundStage.TRAINED:
            raise RuntimeError(f"step {self.step}: Finished before training ended")
        self.stage = RoundStage.FINISHED

    def stop(self) -> None:
        """The round's training time is over: cancel it unless its training has ended."""
        if not self.training_done:
            self.stage = RoundStage.CANCELLED

    def cancel(self) -> None:
        """Nothing more is done for this round: no training, publishing or verifying."""
        self.stage = RoundStage.CANCELLED

    @property
    def batches_left(self) -> int:
        return max(0, len(self.roles.my_batches) - self.batches_done)

    def downloads_settled(self) -> bool:
        """Every download of this round has finished (verified, decoded, or given up)."""
        return all(download.settled for download in self.downloads.values())

    def mean_loss(self) -> float | None:
        return sum(self.losses) / len(self.losses) if self.losses else None
