"""What a trainer signs for one result and what clients announce to each other: the types and
their wire forms, with no cryptography (signing and checking signatures happen at the edges:
`psyche_client.p2p.announcements` signs and verifies, the server checks an equivocation proof
with the verifier it passes to the coordinator).

A trainer's `ResultCommitment` (version 3) names the run and round it was made for and the
exact bytes it published, not only the DisTrO data hash: the signed statement is

    b"psyche-py/result-commitment/v3\\x00" | run_id length u8 | run_id (UTF-8, 1 to 32 bytes)
    | round_seed u64 | trainer (32) | step u32 | batch start u64 | batch end u64
    | data_hash (32) | blob_hash (32) | size u64                          (big-endian)

`round_seed` is the coordinator's seed of the round that trained `step` (drawn by the server
when the previous round began, so nobody knows it earlier). A commitment is thus good for one
run and one round only: two commitments an honest key signed in two runs, or in two runs of
one step after the server restored an older state, differ in `run_id` or `round_seed` and prove
nothing (`coordinator.equivocation` also takes proofs only for steps still open).

`blob_hash` is the SHA-256 of the encoded result, whose header holds the trainer nonce, so
two blobs with one data hash (or one data hash with two nonces) are two commitments. The
commitment's id (`commitment_id`, SHA-256 of the statement) is what the round's witnesses put
in their blooms and what every client chooses among; two statements of one trainer for one
(step, batch) that differ are proof that it equivocated (`coordinator.equivocation`).

Two announcement kinds travel between clients (reference §2.5.5, §2.7, §4.2 "Gossip"):

* `ResultAnnouncement` — a trainer's `ResultCommitment` (its `signed` field: the one
  definition of the signed fields) plus the envelope signature. Its wire form names the
  trainer `sender_id` and the commitment's signature `commitment_signature`.
* `FinishedAnnouncement` — "training of step S is done and I hold every payload of the previous
  round" (`warmup=False`), or "my warmup is finished" (`warmup=True`, step 0). It carries the
  Merkle root of the broadcasts the sender saw; its commitment `data_hash = SHA-256(root)`.

Every announcement also carries an envelope signature by its origin (`sender_id`) over the
canonical encoding of `body()` (the reference's `SignedMessage`), so a relaying peer cannot
alter any field. Wire form: a msgpack map with `"kind": "result" | "finished"` (`to_wire` /
`from_wire`, which raise `AnnouncementError` naming the field).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from psyche_common.batch_id import BatchId
from psyche_common.wire_checks import wire_map, wire_uint

RESULT_COMMITMENT_DOMAIN = b"psyche-py/result-commitment/v3\x00"
MAX_RUN_ID_BYTES = 32
"""The longest run id a commitment names (a run id's limit in `state.toml`)."""
HASH_SIZE = 32
PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64
_NUMBERS = struct.Struct(">IQQ")
_SIZE = struct.Struct(">Q")
MAX_U32 = 2**32 - 1
MAX_U64 = 2**64 - 1

SignatureCheck = Callable[[bytes, bytes, bytes], bool]
"""`(public_key, data, signature) -> bool`: an ed25519 check such as
`psyche_common.protocol.identity.verify_signature`, passed in by whoever may load crypto."""


def commitment_statement(
    run_id: str,
    round_seed: int,
    trainer: bytes,
    step: int,
    batch_start: int,
    batch_end: int,
    data_hash: bytes,
    blob_hash: bytes,
    size: int,
) -> bytes:
    """The exact bytes a trainer signs for one result (see the module docstring)."""
    run = run_id_bytes(run_id)
    return (
        RESULT_COMMITMENT_DOMAIN
        + bytes([len(run)])
        + run
        + _SIZE.pack(round_seed)
        + bytes(trainer)
        + _NUMBERS.pack(step, batch_start, batch_end)
        + bytes(data_hash)
        + bytes(blob_hash)
        + _SIZE.pack(size)
    )


def run_id_bytes(run_id: str) -> bytes:
    """`run_id` as UTF-8; raises ValueError unless it is 1 to `MAX_RUN_ID_BYTES` bytes."""
    if not isinstance(run_id, str):
        raise ValueError(f"run_id must be a string, got {type(run_id).__name__}")
    encoded = run_id.encode("utf-8", "surrogatepass")
    if not 1 <= len(encoded) <= MAX_RUN_ID_BYTES:
        raise ValueError(f"run_id must be 1 to {MAX_RUN_ID_BYTES} bytes, got {len(encoded)}")
    return encoded


def commitment_id(statement: bytes) -> bytes:
    """The 32-byte id of a commitment: SHA-256 of its signed statement."""
    return hashlib.sha256(statement).digest()


def _bytes(data: dict[str, Any], key: str, size: int, what: str) -> bytes:
    value = data.get(key)
    if not isinstance(value, bytes) or len(value) != size:
        got = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
        raise ValueError(f"{what}.{key} must be {size} bytes, got {got}")
    return value


@dataclass(frozen=True)
class ResultCommitment:
    """One trainer's signed commitment to one result (see the module docstring)."""

    run_id: str
    round_seed: int
    trainer: bytes
    step: int
    batch: BatchId
    data_hash: bytes
    blob_hash: bytes
    size: int
    signature: bytes

    def statement(self) -> bytes:
        return commitment_statement(
            self.run_id,
            self.round_seed,
            self.trainer,
            self.step,
            self.batch.start,
            self.batch.end,
            self.data_hash,
            self.blob_hash,
            self.size,
        )

    @property
    def commitment_id(self) -> bytes:
        return commitment_id(self.statement())

    def verifies(self, verify: SignatureCheck) -> bool:
        """Whether `signature` is the trainer's over the statement, checked by `verify`."""
        return verify(self.trainer, self.statement(), self.signature)

    def to_wire(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "round_seed": self.round_seed,
            "trainer": self.trainer,
            "step": self.step,
            "batch_start": self.batch.start,
            "batch_end": self.batch.end,
            "data_hash": self.data_hash,
            "blob_hash": self.blob_hash,
            "size": self.size,
            "signature": self.signature,
        }

    @classmethod
    def from_wire(cls, data: Any, what: str = "commitment") -> ResultCommitment:
        """Strict decode; raises ValueError naming the field."""
        data = wire_map(data, what)
        unknown = set(data) - {
            "run_id",
            "round_seed",
            "trainer",
            "step",
            "batch_start",
            "batch_end",
            "data_hash",
            "blob_hash",
            "size",
            "signature",
        }
        if unknown:
            raise ValueError(f"{what} has unknown fields {sorted(unknown)}")
        step = wire_uint(data, "step", what)
        start = wire_uint(data, "batch_start", what)
        end = wire_uint(data, "batch_end", what)
        size = wire_uint(data, "size", what)
        seed = wire_uint(data, "round_seed", what)
        if step > MAX_U32 or max(start, end, size, seed) > MAX_U64:
            raise ValueError(f"{what}: step must fit u32, batch, size and round_seed u64")
        run_id = data.get("run_id")
        try:
            run_id_bytes(run_id)
        except ValueError as exc:
            raise ValueError(f"{what}.{exc}") from None
        if end < start:
            raise ValueError(f"{what}.batch_end ({end}) < batch_start ({start})")
        return cls(
            run_id=run_id,
            round_seed=seed,
            trainer=_bytes(data, "trainer", PUBLIC_KEY_SIZE, what),
            step=step,
            batch=BatchId(start, end),
            data_hash=_bytes(data, "data_hash", HASH_SIZE, what),
            blob_hash=_bytes(data, "blob_hash", HASH_SIZE, what),
            size=size,
            signature=_bytes(data, "signature", SIGNATURE_SIZE, what),
        )


class AnnouncementError(ValueError):
    """An announcement is malformed or one of its signatures does not verify."""


@dataclass(frozen=True)
class ResultAnnouncement:
    """A trainer's signed commitment to its result for one batch, in an envelope.

    The commitment's fields are read under their wire names too (`sender_id` is the trainer,
    `commitment_signature` the commitment's signature, `batch_start` / `batch_end` its batch).
    """

    signed: ResultCommitment
    envelope_signature: bytes = b""

    kind: ClassVar[str] = "result"

    @property
    def step(self) -> int:
        return self.signed.step

    @property
    def batch_start(self) -> int:
        return self.signed.batch.start

    @property
    def batch_end(self) -> int:
        return self.signed.batch.end

    @property
    def batch_range(self) -> tuple[int, int]:
        return (self.batch_start, self.batch_end)

    @property
    def sender_id(self) -> bytes:
        return self.signed.trainer

    @property
    def run_id(self) -> str:
        return self.signed.run_id

    @property
    def round_seed(self) -> int:
        return self.signed.round_seed

    @property
    def data_hash(self) -> bytes:
        return self.signed.data_hash

    @property
    def commitment_signature(self) -> bytes:
        return self.signed.signature

    @property
    def blob_hash(self) -> bytes:
        return self.signed.blob_hash

    @property
    def size(self) -> int:
        return self.signed.size

    def statement(self) -> bytes:
        """The bytes `commitment_signature` covers (`commitment_statement`)."""
        return self.signed.statement()

    @property
    def commitment(self) -> bytes:
        """The id of the signed commitment: what witnesses attest and clients choose among."""
        return self.signed.commitment_id

    def body(self) -> list[Any]:
        """Every field but the envelope signature, in wire order (what the envelope signs)."""
        return [self.kind, *(getattr(self, name) for name in _RESULT_FIELDS)]


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

    kind: ClassVar[str] = "finished"

    def body(self) -> list[Any]:
        """Every field but the envelope signature, in wire order (what the envelope signs)."""
        return [self.kind, *(getattr(self, name) for name in _FINISHED_FIELDS)]


Announcement = ResultAnnouncement | FinishedAnnouncement

_Spec = tuple[Any, ...]

_SPECS: dict[str, dict[str, _Spec]] = {
    "result": {
        "run_id": ("run_id",),
        "round_seed": ("u64",),
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
    "finished": {
        "step": ("u32",),
        "sender_id": ("bytes", PUBLIC_KEY_SIZE),
        "warmup": ("bool",),
        "broadcast_merkle": ("bytes", HASH_SIZE),
        "data_hash": ("bytes", HASH_SIZE),
        "commitment_signature": ("bytes", SIGNATURE_SIZE),
        "envelope_signature": ("bytes", SIGNATURE_SIZE),
    },
}
"""Each kind's wire fields, in wire order, with their types."""

_RESULT_FIELDS = tuple(name for name in _SPECS["result"] if name != "envelope_signature")
_FINISHED_FIELDS = tuple(name for name in _SPECS["finished"] if name != "envelope_signature")


def _check_value(kind: str, name: str, spec: _Spec, value: Any) -> None:
    where = f"{kind}.{name}"
    if spec[0] in ("u32", "u64"):
        limit = MAX_U32 if spec[0] == "u32" else MAX_U64
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise AnnouncementError(f"{where} must be an integer in [0, {limit}], got {value!r}")
    elif spec[0] == "run_id":
        try:
            run_id_bytes(value)
        except ValueError as exc:
            raise AnnouncementError(f"{kind}.{exc}") from None
    elif spec[0] == "bool":
        if not isinstance(value, bool):
            raise AnnouncementError(f"{where} must be a boolean, got {type(value).__name__}")
    elif spec[0] == "bytes" and (not isinstance(value, bytes) or len(value) != spec[1]):
        got = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
        raise AnnouncementError(f"{where} must be {spec[1]} bytes, got {got}")


def _check_values(kind: str, values: dict[str, Any]) -> None:
    """Raise `AnnouncementError` naming the first field of `values` (wire names) that is out
    of its type; an empty envelope signature passes (not signed yet)."""
    for name, spec in _SPECS[kind].items():
        value = values[name]
        if name == "envelope_signature" and value == b"":
            continue  # not signed yet (checked again by the signature test)
        _check_value(kind, name, spec, value)
    if kind == "result" and values["batch_end"] < values["batch_start"]:
        raise AnnouncementError(
            f"result.batch_end ({values['batch_end']}) < batch_start ({values['batch_start']})"
        )


def result_announcement(
    *,
    run_id: str,
    round_seed: int,
    step: int,
    batch_start: int,
    batch_end: int,
    sender_id: bytes,
    data_hash: bytes,
    commitment_signature: bytes,
    blob_hash: bytes,
    size: int,
    envelope_signature: bytes = b"",
) -> ResultAnnouncement:
    """A `ResultAnnouncement` from its wire fields, checked (raises `AnnouncementError`)."""
    values = {
        "run_id": run_id,
        "round_seed": round_seed,
        "step": step,
        "batch_start": batch_start,
        "batch_end": batch_end,
        "sender_id": sender_id,
        "data_hash": data_hash,
        "commitment_signature": commitment_signature,
        "blob_hash": blob_hash,
        "size": size,
        "envelope_signature": envelope_signature,
    }
    _check_values("result", values)
    signed = ResultCommitment(
        run_id=run_id,
        round_seed=round_seed,
        trainer=sender_id,
        step=step,
        batch=BatchId(batch_start, batch_end),
        data_hash=data_hash,
        blob_hash=blob_hash,
        size=size,
        signature=commitment_signature,
    )
    return ResultAnnouncement(signed, envelope_signature)


def check_fields(announcement: Announcement) -> None:
    """Raise `AnnouncementError` naming the first field out of its type."""
    _check_values(announcement.kind, _values(announcement))


def _values(announcement: Announcement) -> dict[str, Any]:
    return {name: getattr(announcement, name) for name in _SPECS[announcement.kind]}


def to_wire(announcement: Announcement) -> dict[str, Any]:
    """msgpack-safe map of an announcement (bytes stay bytes)."""
    return {"kind": announcement.kind, **_values(announcement)}


def from_wire(wire: Any) -> Announcement:
    """Strictly decode a received announcement map; raises `AnnouncementError` naming the field."""
    if not isinstance(wire, dict):
        raise AnnouncementError(f"announcement must be a map, got {type(wire).__name__}")
    kind = wire.get("kind")
    if kind not in _SPECS:
        raise AnnouncementError(f"announcement.kind must be 'result' or 'finished', got {kind!r}")
    spec = _SPECS[kind]
    unknown = set(wire) - set(spec) - {"kind"}
    if unknown:
        raise AnnouncementError(f"{kind} announcement has unknown fields {sorted(unknown)}")
    missing = set(spec) - set(wire)
    if missing:
        raise AnnouncementError(f"{kind} announcement is missing fields {sorted(missing)}")
    for name, field_spec in spec.items():
        _check_value(kind, name, field_spec, wire[name])
    values = {name: wire[name] for name in spec}
    if kind == "result":
        return result_announcement(**values)
    announcement = FinishedAnnouncement(**values)
    check_fields(announcement)
    return announcement
