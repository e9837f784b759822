"""The round pipeline's ports: what it needs from the outside world, and its options.

`PeerNetwork` (the P2P node), `Uplink` (the server connection), `DataFetcher` (samples of a
batch), `BackendLoader` and `CooldownHook` are the only ways the pipeline reaches out; tests
pass in-memory fakes. Also here: `RunnerOptions` and the warmup witness.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from psyche_common.announcements import FinishedAnnouncement, ResultAnnouncement
from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom
from psyche_common.config import HubCheckpoint
from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.committee import CommitteeProof, WitnessProof
from psyche_common.coordinator.equivocation import EquivocationProof
from psyche_common.coordinator.types import Witness
from psyche_common.protocol.messages import WitnessMetadata

from psyche_client.round.witness_builder import EMPTY_MERKLE_ROOT
from psyche_client.training.backend import TrainingBackend
from psyche_client.verify.threshold import ACCUSE_BELOW


class PeerNetwork(Protocol):
    """The P2P node as the pipeline uses it."""

    async def announce(self, announcement: ResultAnnouncement | FinishedAnnouncement) -> None: ...

    def publish_blob(self, data: bytes, step: int) -> bytes: ...

    async def fetch_blob(
        self, blob_hash: bytes, size: int, providers: Sequence[bytes]
    ) -> bytes: ...

    def begin_step(self, step: int) -> None:
        """A round of ``step`` starts: count traffic against it, drop blobs before step − 2."""
        ...


class Uplink(Protocol):
    """The server connection as the pipeline uses it: domain values, put in wire form only
    by the server link."""

    async def send_witness(self, witness: Witness, metadata: WitnessMetadata) -> None: ...

    async def send_warmup_witness(self, witness: Witness) -> None: ...

    async def send_health_check(
        self, checks: Sequence[tuple[bytes, CommitteeProof]], step: int, weights_hash: bytes
    ) -> None:
        """Accusations (client id, its committee proof; may be empty) and our weights hash."""
        ...

    async def send_checkpoint(self, checkpoint: HubCheckpoint) -> None:
        """The Hub checkpoint this client uploaded at a Cooldown."""
        ...

    async def send_join(self) -> None: ...

    async def send_accusation(
        self,
        step: int,
        trainer: bytes,
        batch: BatchId,
        agreement_milli: int,
        commitment: bytes | None = None,
    ) -> None:
        """A verifier's report: `trainer`'s result `commitment` for `batch` failed the check."""
        ...

    async def send_attestation(
        self, step: int, trainer: bytes, batch: BatchId, agreement_milli: int, commitment: bytes
    ) -> None:
        """A verifier's report: `trainer`'s result `commitment` for `batch` passed the check."""
        ...

    async def send_equivocation(self, proof: EquivocationProof) -> None:
        """Two conflicting signed commitments of one trainer for one batch."""
        ...


class ModelUnavailable(Exception):
    """A `BackendLoader` could not get the model now, but may later (no peer answered with a
    model, or the peers disagree on it): the pipeline logs it and tries again."""


DataFetcher = Callable[[BatchId], Awaitable[np.ndarray]]
"""Samples of a batch; raises once it gives up (the batch is then not trained)."""
BackendLoader = Callable[[Coordinator], Awaitable[TrainingBackend]]
"""Builds the training backend for the run; raises `ModelUnavailable` when it may succeed later."""
CooldownHook = Callable[[Coordinator, TrainingBackend], Awaitable[None]]
SnapshotShare = Callable[[Coordinator, TrainingBackend], Awaitable[None]]
"""A member at the round a mid-epoch joiner's snapshot is due: serve this step's weights (the
caller holds the model lock)."""
SnapshotLoader = Callable[[Coordinator, TrainingBackend, int], Awaitable[None]]
"""A mid-epoch joiner: load the members' weights of the given step into the backend; raises
when they cannot be had (`ModelShareError`)."""
WeightsCheck = Callable[[Coordinator, TrainingBackend], Awaitable[str]]
"""At a Warmup with a peer-to-peer checkpoint: make our weights the members' majority's;
returns "in sync", "resynced" or "undecided"."""


@dataclass
class RunnerOptions:
    """Knobs of the round pipeline: the result-download backoff, where to write own results,
    whether batches need data (False with the dummy backend), whether the next round is
    prepared while the current one's witnesses report, and the verifier's threshold."""

    download_backoff: float = 2.0
    write_gradients_dir: Path | None = None
    needs_data: bool = True
    prepare_next_round: bool = True
    verify_threshold: float = ACCUSE_BELOW
    """As a verifier, report results whose agreement is below this (docs/verification.md)."""
    load_retry_first: float = 2.0
    load_retry_max: float = 16.0
    """Seconds before the first retry of a model load that raised `ModelUnavailable`,
    doubling up to `load_retry_max`."""


def empty_witness(proof: WitnessProof) -> Witness:
    """A witness that attests nothing (empty blooms, empty Merkle root): the warmup witness."""
    return Witness(proof, Bloom(), Bloom(), EMPTY_MERKLE_ROOT)
