"""Pure witness bookkeeping of one round (reference §2.6 step 4, §2.7).

While a round's results arrive, a client records every *verified* payload: the uploader's
``SHA-256(signer)`` goes into the participant bloom, and the first verified commitment of each
batch (``ResultAnnouncement.commitment``, which names the exact blob) into the broadcast bloom.
It also keeps every announced commitment (in arrival order) for the Merkle root sent with
``Finished`` and with a witness, and when each batch's first verified result arrived (the
timings a witness reports for per-client shares, `Witness.result_ms`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom
from psyche_common.coordinator.health import participant_key
from psyche_common.coordinator.types import U32_MAX

EMPTY_MERKLE_ROOT = bytes(32)


def merkle_root(items: Iterable[bytes]) -> bytes:
    """Merkle root: leaf ``SHA-256(0x00‖item)``, node ``SHA-256(0x01‖L‖R)``, odd levels pair
    the last node with itself; an empty list gives 32 zero bytes."""
    level = [hashlib.sha256(b"\x00" + item).digest() for item in items]
    if not level:
        return EMPTY_MERKLE_ROOT
    while len(level) > 1:
        if len(level) % 2:
            level.append(level[-1])
        level = [
            hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
            for i in range(0, len(level), 2)
        ]
    return level[0]


@dataclass
class RoundWitnessState:
    """Blooms, remaining batches and announced commitments of one round."""

    participant_bloom: Bloom
    broadcast_bloom: Bloom
    remaining_batches: set[BatchId] | None
    broadcasts: list[bytes] = field(default_factory=list)
    arrived_ms: dict[BatchId, int] = field(default_factory=dict)
    """Per batch: milliseconds from the round's start here to its first verified result."""

    @classmethod
    def new(
        cls,
        batch_ids: Iterable[BatchId],
        num_clients: int,
        bloom_factory: Callable[[int], Bloom],
    ) -> RoundWitnessState:
        batches = set(batch_ids)
        return cls(
            participant_bloom=bloom_factory(max(1, num_clients)),
            broadcast_bloom=bloom_factory(max(1, len(batches))),
            remaining_batches=batches or None,
        )

    def record_announcement(self, commitment: bytes) -> None:
        """A signed broadcast (result or Finished) was accepted: it goes into the Merkle list."""
        self.broadcasts.append(commitment)

    def record_verified(
        self, signer: bytes, batch: BatchId, commitment: bytes, elapsed_ms: int = 0
    ) -> bool:
        """A downloaded payload matched its commitment, `elapsed_ms` after the round started
        here. Returns True when it was the first verified payload of its batch (its
        commitment went into the broadcast bloom)."""
        if self.remaining_batches is None:
            return False
        if elapsed_ms > 0:
            self.arrived_ms.setdefault(batch, min(elapsed_ms, U32_MAX))
        self.participant_bloom.add(participant_key(signer))
        first = batch in self.remaining_batches
        if first:
            self.broadcast_bloom.add(commitment)
            self.remaining_batches.discard(batch)
            if not self.remaining_batches:
                self.remaining_batches = None
        return first

    @property
    def all_batches_seen(self) -> bool:
        return self.remaining_batches is None

    def merkle(self) -> bytes:
        return merkle_root(self.broadcasts)

    def timings(self, batch_ids: Iterable[BatchId]) -> list[int]:
        """`Witness.result_ms`: per batch of the round in sample order, when its first
        verified result arrived (0: never)."""
        return [self.arrived_ms.get(batch, 0) for batch in sorted(batch_ids)]
