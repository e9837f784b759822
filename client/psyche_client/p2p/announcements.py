"""Signing and verifying P2P announcements: "I trained this batch" and "I finished step S".

The announcement types and their wire forms are `psyche_common.announcements` (torch-free and
crypto-free, shared with the round pipeline and the coordinator); this module is where they
meet ed25519. A `ResultAnnouncement` carries the trainer's signature over its commitment
statement (version 3, bound to the run and the round's seed: the reference signs the data
hash alone); a `FinishedAnnouncement` the
sender's signature over its `data_hash = SHA-256(broadcast_merkle)`. Every announcement also
carries an envelope signature by its origin (`sender_id`) over the canonical encoding of all
other fields (the reference's `SignedMessage`), so a relaying peer cannot alter any field.
Verification here is purely cryptographic; committee / assignment checks ("is the sender the
trainer of this batch?") belong to the client app. Two different result commitments of one
trainer for one batch prove that it equivocated (`proof_of`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TypeVar

from psyche_common.announcements import (
    Announcement,
    AnnouncementError,
    FinishedAnnouncement,
    ResultAnnouncement,
    check_fields,
    commitment_statement,
    from_wire,
    result_announcement,
    to_wire,
)
from psyche_common.coordinator.equivocation import EquivocationProof
from psyche_common.protocol import Identity, encode_payload, verify_signature

__all__ = [
    "ENVELOPE_DOMAIN",
    "Announcement",
    "AnnouncementError",
    "FinishedAnnouncement",
    "ResultAnnouncement",
    "envelope_bytes",
    "from_wire",
    "make_finished_announcement",
    "make_result_announcement",
    "message_id",
    "proof_of",
    "to_wire",
    "verify_announcement",
]

ENVELOPE_DOMAIN = b"psyche-py/p2p-announcement/v2\x00"

_A = TypeVar("_A", ResultAnnouncement, FinishedAnnouncement)


def envelope_bytes(announcement: Announcement) -> bytes:
    """The exact bytes the envelope signature covers."""
    return ENVELOPE_DOMAIN + encode_payload(announcement.body())


def message_id(announcement: Announcement) -> bytes:
    """De-duplication key: SHA-256 of the signed body plus its envelope signature."""
    return hashlib.sha256(envelope_bytes(announcement) + announcement.envelope_signature).digest()


def make_result_announcement(
    identity: Identity,
    *,
    run_id: str,
    round_seed: int,
    step: int,
    batch_start: int,
    batch_end: int,
    data_hash: bytes,
    blob_hash: bytes,
    size: int,
) -> ResultAnnouncement:
    """Sign the commitment (run, round seed, data hash, blob and size) and the whole
    announcement."""
    statement = commitment_statement(
        run_id,
        round_seed,
        identity.public_key,
        step,
        batch_start,
        batch_end,
        data_hash,
        blob_hash,
        size,
    )
    unsigned = result_announcement(
        run_id=run_id,
        round_seed=round_seed,
        step=step,
        batch_start=batch_start,
        batch_end=batch_end,
        sender_id=identity.public_key,
        data_hash=bytes(data_hash),
        commitment_signature=identity.sign(statement),
        blob_hash=bytes(blob_hash),
        size=size,
    )
    return _with_envelope(identity, unsigned)


def make_finished_announcement(
    identity: Identity, *, step: int, warmup: bool, broadcast_merkle: bytes
) -> FinishedAnnouncement:
    """A signed Finished message; its commitment is `SHA-256(broadcast_merkle)`."""
    data_hash = hashlib.sha256(bytes(broadcast_merkle)).digest()
    unsigned = FinishedAnnouncement(
        step=step,
        sender_id=identity.public_key,
        warmup=warmup,
        broadcast_merkle=bytes(broadcast_merkle),
        data_hash=data_hash,
        commitment_signature=identity.sign(data_hash),
    )
    check_fields(unsigned)
    return _with_envelope(identity, unsigned)


def _with_envelope(identity: Identity, announcement: _A) -> _A:
    signature = identity.sign(envelope_bytes(announcement))
    return dataclasses.replace(announcement, envelope_signature=signature)


def verify_announcement(announcement: Announcement) -> None:
    """Raise `AnnouncementError` unless both signatures by `sender_id` verify."""
    check_fields(announcement)
    if isinstance(announcement, FinishedAnnouncement) and announcement.data_hash != (
        hashlib.sha256(announcement.broadcast_merkle).digest()
    ):
        raise AnnouncementError("finished.data_hash is not SHA-256(broadcast_merkle)")
    committed = (
        announcement.statement()
        if isinstance(announcement, ResultAnnouncement)
        else announcement.data_hash
    )
    if not verify_signature(announcement.sender_id, committed, announcement.commitment_signature):
        raise AnnouncementError(
            f"{announcement.kind}.commitment_signature does not verify for sender "
            f"{announcement.sender_id[:4].hex()}"
        )
    if not verify_signature(
        announcement.sender_id, envelope_bytes(announcement), announcement.envelope_signature
    ):
        raise AnnouncementError(
            f"{announcement.kind}.envelope_signature does not verify for sender "
            f"{announcement.sender_id[:4].hex()}"
        )


def proof_of(first: ResultAnnouncement, second: ResultAnnouncement) -> EquivocationProof:
    """The equivocation proof two conflicting result announcements of one trainer make."""
    return EquivocationProof(first.signed, second.signed)
