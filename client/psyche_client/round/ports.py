"""Interfaces and small shared pieces of the round pipeline.

`PeerNetwork` (what the pipeline needs from the P2P node), `Uplink` (from the server
connection), `RunnerOptions`, `DesyncError`, the coordinator run-state name and the wire form
of a witness.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from psyche_common.assignment import BatchId
from psyche_common.bloom import Bloom
from psyche_common.committee import WitnessProof

from psyche_client.round.witness_builder import EMPTY_MERKLE_ROOT
from psyche_client.training.backend import TrainingBackend


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

    async def send_join(self) -> None: ...


DataFetcher = Callable[[BatchId], Awaitable[Any]]
BackendLoader = Callable[[Any], Awaitable[TrainingBackend]]
CooldownHook = Callable[[Any, TrainingBackend], Awaitable[None]]


@dataclass
class RunnerOptions:
    """Knobs of the round pipeline: retry delays, where to write own results, and whether
    batches need data (False with the dummy backend)."""

    fetch_retry_delay: float = 2.0
    download_backoff: float = 2.0
    write_gradients_dir: Path | None = None
    needs_data: bool = True


def run_state_name(coordinator: Any) -> str:
    """The run state as its wire text (``"RoundTrain"``), for a StrEnum or a plain string."""
    state = coordinator.run_state
    return str(state)


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
