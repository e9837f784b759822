"""Signed peer-to-peer announcements: "I trained this batch" and "I finished step S".

Two message kinds travel between clients (reference §2.5.5, §2.7, §4.2 "Gossip"):

* `ResultAnnouncement` — a trainer's commitment to one DisTrO result: step, batch range,
  `data_hash` (the SHA-256 commitment computed by `psyche_client.distro`), where to get the
  payload (the SHA-256 `blob_hash` of the encoded result, which holds the trainer nonce, and
  its `size` in bytes), and the trainer's ed25519 `commitment_signature` over all of them
  (`psyche_common.protocol.result_commitment`, version 2: the reference signs the data hash
  alone). Its `commitment` (the id of that signed statement) names the exact blob: two
  different ones of a trainer for one batch prove that it equivocated (`proof_of`).
* `FinishedAnnouncement` — "training of step S is done and I hold every payload of the previous
  round" (`warmup=False`), or "my warmup is finished" (`warmup=True`, step 0). It carries the
  Merkle root of the broadcasts the sender saw; its commitment `data_hash = SHA-256(root)`.

Every announcement also carries an envelope signature by its origin (`sender_id`) over the
canonical encoding of all other fields (the reference's `SignedMessage`), so a relaying peer
cannot alter any field. Verification here is purely cryptographic; committee / assignment
checks ("is the sender the trainer of this batch?") belong to the client app.

Wire form: a msgpack map with `"kind": "result" | "finished"` (see `to_wire` / `from_wire`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import Any

from psyche_common.batch_id import BatchId
from psyche_common.coordinator.equivocation import EquivocationProof
from psyche_common.protocol import Identity, encode_payload, verify_signature
from psyche_common.protocol.result_commitment import (
    ResultCommitment,
    commitment_id,
    commitment_statement,
)

ENVELOPE_DOMAIN = b"psyche-py/p2p-announcement/v2\x00"
HASH_SIZE = 32
PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64
MAX_U32 = 2**32 - 1
MAX_U64 = 2**64 - 1


class AnnouncementError(ValueError):
    """An announcement is malformed or one of its signatures does not verify."""


@dataclass(frozen=True)
class ResultAnnouncement:
    """A trainer's signed commitment to its result for batch `[batch_start, batch_end]`."""

    step: int
    batch_start: int
    batch_end: int
    sender_id: bytes
    data_hash: bytes
    commitment_signature: bytes
    blob_hash: bytes
    size: int
    envelope_signature: bytes = b""

    kind = "result"

    @property
    def batch_range(self) -> tuple[int, int]:
        return (self.batch_start, self.batch_end)

    def statement(self) -> bytes:
        """The bytes `commitment_signature` covers (`result_commitment`)."""
        return commitment_statement(
            self.sender_id,
            self.step,
            self.batch_start,
            self.batch_end,
            self.data_hash,
            self.blob_hash,
            self.size,
        )

    @property
    def commitment(self) -> bytes:
        """The id of the signed commitment: what witnesses attest and clients choose among."""
        return commitment_id(self.statement())

    def signed_commitment(self) -> ResultCommitment:
        return ResultCommitment(
            trainer=self.sender_id,
            step=self.step,
            batch=BatchId(self.batch_start, self.batch_end),
            data_hash=self.data_hash,
            blob_hash=self.blob_hash,
            size=self.size,
            signature=self.commitment_signature,
        )


@dataclass(frozen=True)
class FinishedAnnouncement:
    """A client's signed "finished step S" (or "warmup finished") message."""

    step: int
    sender_id: bytes
    warmup: bool
    broadcast_merkle: bytes
    data_hash: bytes
    commitment_signature: bytes
    envelope_signature: bytes = b""

    kind = "finished"


Announcement = ResultAnnouncement | FinishedAnnouncement


def _body(announcement: Announcement) -> list[Any]:
    """Every field except the envelope signature, in declaration order, for signing."""
    values: list[Any] = [announcement.kind]
    values.extend(
        getattr(announcement, f.name)
        for f in fields(announcement)
        if f.name != "envelope_signature"
    )
    return values


def envelope_bytes(announcement: Announcement) -> bytes:
    """The exact bytes the envelope signature covers."""
    return ENVELOPE_DOMAIN + encode_payload(_body(announcement))


def message_id(announcement: Announcement) -> bytes:
    """De-duplication key: SHA-256 of the signed body plus its envelope signature."""
    return hashlib.sha256(envelope_bytes(announcement) + announcement.envelope_signature).digest()


def make_result_announcement(
    identity: Identity,
    *,
    step: int,
    batch_start: int,
    batch_end: int,
    data_hash: bytes,
    blob_hash: bytes,
    size: int,
) -> ResultAnnouncement:
    """Sign the commitment (data hash, blob and size) and the whole announcement."""
    statement = commitment_statement(
        identity.public_key, step, batch_start, batch_end, data_hash, blob_hash, size
    )
    unsigned = ResultAnnouncement(
        step=step,
        batch_start=batch_start,
        batch_end=batch_end,
        sender_id=identity.public_key,
        data_hash=bytes(data_hash),
        commitment_signature=identity.sign(statement),
        blob_hash=bytes(blob_hash),
        size=size,
    )
    _check_fields(unsigned)
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
    _check_fields(unsigned)
    return _with_envelope(identity, unsigned)


def _with_envelope(identity: Identity, announcement: Any) -> Any:
    signature = identity.sign(envelope_bytes(announcement))
    return type(announcement)(
        **{f.name: getattr(announcement, f.name) for f in fields(announcement)}
        | {"envelope_signature": signature}
    )


def verify_announcement(announcement: Announcement) -> None:
    """Raise `AnnouncementError` unless both signatures by `sender_id` verify."""
    _check_fields(announcement)
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
    return EquivocationProof(first.signed_commitment(), second.signed_commitment())


def to_wire(announcement: Announcement) -> dict[str, Any]:
    """msgpack-safe map of an announcement (bytes stay bytes)."""
    wire: dict[str, Any] = {"kind": announcement.kind}
    wire.update({f.name: getattr(announcement, f.name) for f in fields(announcement)})
    return wire


_SPECS: dict[str, tuple[type, dict[str, Any]]] = {
    "result": (
        ResultAnnouncement,
        {
            "step": ("u32",),
            "batch_start": ("u64",),
            "batch_end": ("u64",),
            "sender_id": ("bytes", PUBLIC_KEY_SIZE),
            "data_hash": ("bytes", HASH_SIZE),
            "commitment_signature": ("bytes", SIGNATURE_SIZE),
            "blob_hash": ("bytes", HASH_SIZE),
            "size": ("u64",),
            "envelope_signature": ("bytes", SIGNATURE_SIZE),
        },
    ),
    "finished": (
        FinishedAnnouncement,
        {
            "step": ("u32",),
            "sender_id": ("bytes", PUBLIC_KEY_SIZE),
            "warmup": ("bool",),
            "broadcast_merkle": ("bytes", HASH_SIZE),
            "data_hash": ("bytes", HASH_SIZE),
            "commitment_signature": ("bytes", SIGNATURE_SIZE),
            "envelope_signature": ("bytes", SIGNATURE_SIZE),
        },
    ),
}


def _check_value(kind: str, name: str, spec: tuple[Any, ...], value: Any) -> None:
    where = f"{kind}.{name}"
    if spec[0] in ("u32", "u64"):
        limit = MAX_U32 if spec[0] == "u32" else MAX_U64
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise AnnouncementError(f"{where} must be an integer in [0, {limit}], got {value!r}")
    elif spec[0] == "bool":
        if not isinstance(value, bool):
            raise AnnouncementError(f"{where} must be a boolean, got {type(value).__name__}")
    elif spec[0] == "bytes" and (not isinstance(value, bytes) or len(value) != spec[1]):
        got = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
        raise AnnouncementError(f"{where} must be {spec[1]} bytes, got {got}")


def _check_fields(announcement: Announcement) -> None:
    _, spec = _SPECS[announcement.kind]
    for name, field_spec in spec.items():
        value = getattr(announcement, name)
        if name == "envelope_signature" and value == b"":
            continue  # not signed yet (checked again by verify_announcement's signature test)
        _check_value(announcement.kind, name, field_spec, value)
    if isinstance(announcement, ResultAnnouncement) and (
        announcement.batch_end < announcement.batch_start
    ):
        raise AnnouncementError(
            f"result.batch_end ({announcement.batch_end}) < batch_start "
            f"({announcement.batch_start})"
        )


def from_wire(wire: Any) -> Announcement:
    """Strictly decode a received announcement map; raises `AnnouncementError` naming the field."""
    if not isinstance(wire, dict):
        raise AnnouncementError(f"announcement must be a map, got {type(wire).__name__}")
    kind = wire.get("kind")
    if kind not in _SPECS:
        raise AnnouncementError(f"announcement.kind must be 'result' or 'finished', got {kind!r}")
    cls, spec = _SPECS[kind]
    unknown = set(wire) - set(spec) - {"kind"}
    if unknown:
        raise AnnouncementError(f"{kind} announcement has unknown fields {sorted(unknown)}")
    missing = set(spec) - set(wire)
    if missing:
        raise AnnouncementError(f"{kind} announcement is missing fields {sorted(missing)}")
    for name, field_spec in spec.items():
        _check_value(kind, name, field_spec, wire[name])
    announcement = cls(**{name: wire[name] for name in spec})
    _check_fields(announcement)
    return announcement
