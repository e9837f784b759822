"""Applying a validated client message to the coordinator (no I/O, no connection state).

`apply_client_message` converts the message's nested wire dicts (`bridge`) and calls the matching
coordinator method. It raises `CoordinatorError` when the coordinator refuses (the caller logs
it; the sender stays connected) and `InvalidMessage` when a nested structure is malformed (the
caller ends the connection). `Join` is handled by `membership` (it changes the pending set, not
the coordinator).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Collection

from psyche_common.batch_id import BatchId
from psyche_common.coordinator import Accusation as CoordinatorAccusation
from psyche_common.coordinator import Attestation as CoordinatorAttestation
from psyche_common.coordinator import Coordinator, VerificationRecord
from psyche_common.coordinator.equivocation import EquivocationProof
from psyche_common.protocol import short_id
from psyche_common.protocol.identity import verify_signature
from psyche_common.protocol.messages import (
    Accusation,
    AnyClientMessage,
    Attestation,
    Checkpoint,
    Equivocation,
    HealthCheck,
    InvalidMessage,
    WarmupWitness,
    Witness,
)

from .bridge import parse_checkpoint, parse_health_checks, parse_witness

log = logging.getLogger("psyche.server")


def apply_client_message(
    coordinator: Coordinator,
    client_id: bytes,
    message: AnyClientMessage,
    now: float,
    checkpointers: Collection[bytes] = frozenset(),
) -> None:
    """Apply `message`; a `Checkpoint` is accepted only from one of `checkpointers`."""
    if isinstance(message, WarmupWitness):
        witness = parse_witness("WarmupWitness", message.witness)
        coordinator.warmup_witness(
            client_id, witness, now, secrets.randbits(64), secrets.token_bytes(32)
        )
    elif isinstance(message, Witness):
        coordinator.witness(client_id, parse_witness("Witness", message.witness), now)
    elif isinstance(message, HealthCheck):
        if message.checks:
            dropped = coordinator.health_check(client_id, parse_health_checks(message))
            log.info(
                "health check from %s dropped %d client(s)",
                short_id(client_id),
                dropped,
                extra={"client": short_id(client_id), "dropped": dropped},
            )
    elif isinstance(message, Checkpoint):
        checkpoint = parse_checkpoint(message.checkpoint)
        index = coordinator.client_index(client_id)
        if index is None:
            log.warning(
                "checkpoint from %s, which is not a client of this epoch", short_id(client_id)
            )
        else:
            coordinator.checkpoint(client_id, index, checkpoint, checkpointers)
            log.info(
                "checkpoint from %s: now %s",
                short_id(client_id),
                coordinator.model.checkpoint,
                extra={"client": short_id(client_id)},
            )
    elif isinstance(message, Accusation):
        apply_accusation(coordinator, client_id, message)
    elif isinstance(message, Equivocation):
        apply_equivocation(coordinator, client_id, message)
    elif isinstance(message, Attestation):
        apply_attestation(coordinator, client_id, message)
    else:
        raise TypeError(f"not a coordinator message: {type(message).__name__}")


def _batch(message: Accusation | Attestation) -> BatchId:
    try:
        return BatchId.from_wire(message.batch)
    except ValueError as exc:
        raise InvalidMessage(f"{message.type}.batch: {exc}") from exc


def apply_accusation(coordinator: Coordinator, client_id: bytes, message: Accusation) -> None:
    """Record a verifier's accusation (judged when its step closes: `log_new_convictions`)."""
    accusation = CoordinatorAccusation(
        step=message.step,
        verifier=client_id,
        trainer=message.trainer,
        batch=_batch(message),
        agreement_milli=message.agreement_milli,
        commitment=message.commitment,
    )
    coordinator.accuse(client_id, accusation)
    log.info(
        "accusation: %s",
        accusation,
        extra={"client": short_id(client_id), "accused": short_id(message.trainer)},
    )


def apply_attestation(coordinator: Coordinator, client_id: bytes, message: Attestation) -> None:
    """Record that a verifier passed a result (it refutes accusations of that result)."""
    attestation = CoordinatorAttestation(
        step=message.step,
        verifier=client_id,
        trainer=message.trainer,
        batch=_batch(message),
        agreement_milli=message.agreement_milli,
        commitment=message.commitment,
    )
    coordinator.attest(client_id, attestation)
    log.debug("attestation: %s", attestation, extra={"client": short_id(client_id)})


class ConvictionLog:
    """Logs each conviction of the coordinator's record once (a warning), whichever tick or
    message made it; remembers only the convictions the record still holds."""

    def __init__(self, record: VerificationRecord) -> None:
        self._seen = set(record.convictions)

    def log_new(self, record: VerificationRecord) -> int:
        """Log the convictions not logged before; returns how many there were."""
        current = set(record.convictions)
        new = 0
        for conviction in record.convictions:
            if conviction not in self._seen:
                new += 1
                log.warning(
                    "conviction: %s; removed from the epoch, its results are not applied",
                    conviction,
                    extra={
                        "client": short_id(conviction.trainer),
                        "convicted_step": conviction.step,
                        "conviction_kind": conviction.kind.value,
                    },
                )
                if conviction.proven and conviction.trainer not in record.bans:
                    log.error(
                        "%s cannot be banned for later epochs: the server keeps %d bans "
                        "already (MAX_BANS) and evicts none; it is removed for epoch %d only",
                        short_id(conviction.trainer),
                        len(record.bans),
                        conviction.epoch,
                        extra={"client": short_id(conviction.trainer), "bans": len(record.bans)},
                    )
        self._seen = current
        return new


def apply_equivocation(coordinator: Coordinator, client_id: bytes, message: Equivocation) -> None:
    """Check an equivocation proof (both signatures, ed25519 by `verify_signature`: the
    coordinator takes the check as an argument so that it loads no cryptography) and convict
    its trainer on it (the conviction is logged by `ConvictionLog`); only members of the epoch may report one (they
    are the ones the trainer sends its announcements to)."""
    if coordinator.client_index(client_id) is None:
        log.warning(
            "equivocation proof from %s, which is not a client of this epoch: ignored",
            short_id(client_id),
        )
        return
    try:
        proof = EquivocationProof.from_wire({"first": message.first, "second": message.second})
    except ValueError as exc:
        raise InvalidMessage(f"Equivocation: {exc}") from exc
    recorded = coordinator.equivocation(client_id, proof, verify_signature)
    if recorded is not None:
        log.info(
            "equivocation: %s signed two commitments for %s of step %d (reported by %s)",
            short_id(recorded.trainer),
            proof.first.batch,
            proof.first.step,
            short_id(client_id),
            extra={"client": short_id(recorded.trainer), "reporter": short_id(client_id)},
        )


def reported_weights(message: AnyClientMessage) -> tuple[int, bytes] | None:
    """The (step, weights hash) a message reports, if any."""
    if isinstance(message, Witness) and message.metadata.weights_hash is not None:
        return message.metadata.step, message.metadata.weights_hash
    if (
        isinstance(message, HealthCheck)
        and message.step is not None
        and message.weights_hash is not None
    ):
        return message.step, message.weights_hash
    return None
