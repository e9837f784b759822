"""A trainer's health score: how many of a round's witnesses saw its results (reference §5.5).

A witness puts `participant_key(uploader id)` into its participant bloom for every result it
downloaded; a trainer is healthy when at least `witness_quorum` witnesses' blooms hold its key.
The coordinator and the clients (who must accuse exactly the trainers the coordinator would
drop) both count with `health_score`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol


class BloomLike(Protocol):
    """Anything with a membership test (`psyche_common.bloom.Bloom` satisfies it)."""

    def contains(self, item: bytes) -> bool: ...


def participant_key(client_id: bytes) -> bytes:
    """What a participant bloom stores for an uploader: SHA-256 of its id (public key)."""
    return hashlib.sha256(client_id).digest()


def health_score(client_id: bytes, participant_blooms: Sequence[BloomLike]) -> int:
    """How many of `participant_blooms` hold `client_id`'s participant key."""
    key = participant_key(client_id)
    return sum(1 for bloom in participant_blooms if bloom.contains(key))
