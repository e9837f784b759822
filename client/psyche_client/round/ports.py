"""The round pipeline's ports: what it needs from the outside world, and its options.

`PeerNetwork` (the P2P node), `Uplink` (the server connection), `DataFetcher` (samples of a
batch), `BackendLoader` and `CooldownHook` are the only ways the pipeline reaches out; tests
pass in-memory fakes. Also here: `RunnerOptions` and the wire form of a witness.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom
from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.committee import WitnessProof

from psyche_client.p2p.announcements import FinishedAnnouncement, ResultAnnouncement
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
    """The server connection as the pipeline uses it."""

    async def send_witness(self, witness: dict[str, Any], metadata: dict[str, Any]) -> None: ...

    async def send_warmup_witness(self, witness: dict[str, Any]) -> None: ...

    async def send_health_check(
        self, checks: list[tuple[bytes, dict[str, Any]]], step: int, weights_hash: bytes
    ) -> None: ...

    async def send_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...

    async def send_join(self) -> None: ...

    async def send_accusation(
        self, step: int, trainer: bytes, batch: BatchId, agreement_milli: int
    ) -> None:
        """A verifier's report: `trainer`'s result for `batch` failed the check."""
        ...


DataFetcher = Callable[[BatchId], Awaitable[np.ndarray]]
"""Samples of a batch; raises once it gives up (the batch is then not trained)."""
BackendLoader = Callable[[Coordinator], Awaitable[TrainingBackend]]
CooldownHook = Callable[[Coordinator, TrainingBackend], Awaitable[None]]
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


def empty_witness_wire(proof: WitnessProof) -> dict[str, Any]:
    """A witness that attests nothing (empty blooms, empty Merkle root): the warmup witness."""
    return witness_wire(proof, Bloom(), Bloom(), EMPTY_MERKLE_ROOT)


def witness_wire(
    proof: WitnessProof, participant: Bloom, broadcast: Bloom, merkle: bytes
) -> dict[str, Any]:
    return {
        "proof": proof.to_wire(),
        "participant_bloom": participant.to_wire(),
        "broadcast_bloom": broadcast.to_wire(),
        "broadcast_merkle": merkle,
    }
