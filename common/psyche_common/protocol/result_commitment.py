"""What a trainer signs for one result: its `ResultCommitment` (version 2).

A trainer's commitment names the exact bytes it published, not only the DisTrO data hash: the
signed statement is

    b"psyche-py/result-commitment/v2\\x00" | trainer (32) | step u32 | batch start u64
    | batch end u64 | data_hash (32) | blob_hash (32) | size u64          (big-endian)

`blob_hash` is the SHA-256 of the encoded result, whose header holds the trainer nonce, so
two blobs with one data hash (or one data hash with two nonces) are two commitments. The
commitment's id (`commitment_id`, SHA-256 of the statement) is what the round's witnesses put
in their blooms and what every client chooses among; two statements of one trainer for one
(step, batch) that differ are proof that it equivocated (`coordinator.equivocation`). Both the
client (signing, `p2p.announcements`) and the server (checking a proof) use this module.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from psyche_common.batch_id import BatchId
from psyche_common.protocol.identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, verify_signature
from psyche_common.wire_checks import wire_map, wire_uint

RESULT_COMMITMENT_DOMAIN = b"psyche-py/result-commitment/v2\x00"
HASH_SIZE = 32
_NUMBERS = struct.Struct(">IQQ")
_SIZE = struct.Struct(">Q")
MAX_U32 = 2**32 - 1
MAX_U64 = 2**64 - 1


def commitment_statement(
    trainer: bytes,
    step: int,
    batch_start: int,
    batch_end: int,
    data_hash: bytes,
    blob_hash: bytes,
    size: int,
) -> bytes:
    """The exact bytes a trainer signs for one result (see the module docstring)."""
    return (
        RESULT_COMMITMENT_DOMAIN
        + bytes(trainer)
        + _NUMBERS.pack(step, batch_start, batch_end)
        + bytes(data_hash)
        + bytes(blob_hash)
        + _SIZE.pack(size)
    )


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

    trainer: bytes
    step: int
    batch: BatchId
    data_hash: bytes
    blob_hash: bytes
    size: int
    signature: bytes

    def statement(self) -> bytes:
        return commitment_statement(
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

    def verifies(self) -> bool:
        """Whether `signature` is the trainer's over the statement."""
        return verify_signature(self.trainer, self.statement(), self.signature)

    def to_wire(self) -> dict[str, Any]:
        return {
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
        if step > MAX_U32 or max(start, end, size) > MAX_U64:
            raise ValueError(f"{what}: step must fit u32, batch and size u64")
        if end < start:
            raise ValueError(f"{what}.batch_end ({end}) < batch_start ({start})")
        return cls(
            trainer=_bytes(data, "trainer", PUBLIC_KEY_SIZE, what),
            step=step,
            batch=BatchId(start, end),
            data_hash=_bytes(data, "data_hash", HASH_SIZE, what),
            blob_hash=_bytes(data, "blob_hash", HASH_SIZE, what),
            size=size,
            signature=_bytes(data, "signature", SIGNATURE_SIZE, what),
        )
