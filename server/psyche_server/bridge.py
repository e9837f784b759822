"""Conversions between protocol payloads and the coordinator's own types (I/O-free).

Message validation (`psyche_common.protocol.messages`) checks the envelope; the nested wire
dicts are converted here with the coordinator's `from_wire` parsers, and any ValueError becomes
an `InvalidMessage` naming the message and field, which ends the sender's connection.
"""

from __future__ import annotations

from typing import Any

from psyche_common.config.checkpoint import AnyCheckpoint
from psyche_common.config.checkpoint import Checkpoint as CheckpointField
from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.committee import CommitteeProof
from psyche_common.coordinator.types import ClientState, Witness
from psyche_common.protocol.messages import HealthCheck, InvalidMessage, describe_validation_error
from pydantic import TypeAdapter, ValidationError


def parse_witness(kind: str, wire: dict[str, Any]) -> Witness:
    try:
        return Witness.from_wire(wire)
    except (ValueError, TypeError) as exc:
        raise InvalidMessage(f"{kind}.witness: {exc}") from exc


def parse_health_checks(message: HealthCheck) -> list[tuple[bytes, CommitteeProof]]:
    checks = []
    for position, entry in enumerate(message.checks):
        try:
            checks.append((entry.id, CommitteeProof.from_wire(entry.proof)))
        except (ValueError, TypeError) as exc:
            raise InvalidMessage(f"HealthCheck.checks[{position}].proof: {exc}") from exc
    return checks


_checkpoint_adapter: TypeAdapter[AnyCheckpoint] = TypeAdapter(CheckpointField)


def parse_checkpoint(wire: dict[str, Any]) -> AnyCheckpoint:
    """A Checkpoint payload in the state-file form: `{"Hub": {"repo_id": ..., "revision": ...}}`
    or `{"Gcs": {"bucket": ..., "prefix": ...}}`."""
    try:
        return _checkpoint_adapter.validate_python(wire)
    except ValidationError as exc:
        raise InvalidMessage(describe_validation_error("Checkpoint.checkpoint", exc)) from exc


KICKED_STATES = frozenset({ClientState.Dropped, ClientState.Ejected})


def unhealthy_exited_ids(coordinator: Coordinator) -> list[bytes]:
    """Ids in `exited_clients` that a health check removed (Dropped/Ejected); the server kicks
    them from the pending set. Withdrawn clients are not kicked: a disconnect already removed
    them, and a pause or a zero-witness round must not lock connected clients out of the run
    (the reference kicks every non-Healthy state; see docs/deviations.md)."""
    return [
        client.id
        for client in coordinator.epoch_state.exited_clients
        if client.state in KICKED_STATES
    ]


__all__ = [
    "parse_checkpoint",
    "parse_health_checks",
    "parse_witness",
    "unhealthy_exited_ids",
]
