"""Pure consensus logic of the apply step (reference §2.9 and coordinator §5.5).

At the start of round h a client applies the results of round h−2. For every batch of that
round it picks the one commitment that a quorum of round h−1's witnesses saw in their
broadcast blooms, and only applies that commitment's payload. Nothing here does I/O: the
caller passes the commitments it received (in arrival order), the witnesses' blooms and a
predicate telling whether a payload is ready.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


class BloomLike(Protocol):
    """Anything with a membership test (``psyche_common.bloom.Bloom`` satisfies it)."""

    def contains(self, item: bytes) -> bool: ...


def select_consensus_commitment(
    commitments: Sequence[bytes], broadcast_blooms: Sequence[BloomLike], quorum: int
) -> int | None:
    """Index of the commitment (data hash) a witness quorum saw, or None.

    Every witness votes once, for the first commitment (arrival order) found in its broadcast
    bloom. Among the commitments with at least ``quorum`` votes the highest score wins; on a
    tie the last index wins (Rust ``max_by_key``).
    """
    scores = [0] * len(commitments)
    for bloom in broadcast_blooms:
        for index, data_hash in enumerate(commitments):
            if bloom.contains(data_hash):
                scores[index] += 1
                break
    best: int | None = None
    for index, score in enumerate(scores):
        if score >= quorum and (best is None or score >= scores[best]):
            best = index
    return best


class SkipReason(Enum):
    """Why a batch of round h−2 contributes nothing at apply time."""

    NO_COMMITMENT = "untrained batch: no result was announced"
    NO_QUORUM = "no commitment reached the witness quorum"
    COLD_START = "trainer is still in its cold-start warmup"


@dataclass(frozen=True)
class Candidate:
    """One announced result for a batch: who sent it and its commitment data hash."""

    sender: bytes
    data_hash: bytes
    trainer_nonce: int = 0


@dataclass
class ApplyPlan:
    """What to apply at the start of a round: data hashes in batch order, and what was skipped."""

    apply: list[tuple[object, Candidate]] = field(default_factory=list)
    skipped: list[tuple[object, SkipReason]] = field(default_factory=list)


def plan_apply(
    batch_ids: Sequence[object],
    candidates_by_batch: Mapping[object, Sequence[Candidate]],
    broadcast_blooms: Sequence[BloomLike],
    quorum: int,
    cold_start_steps: int = 0,
) -> ApplyPlan:
    """Choose, per batch (in the given canonical order), the result to apply.

    Whether the chosen payload is actually present is the caller's business (it waits for the
    download, then treats a still-missing consensus payload as a desync, like the reference).
    ``cold_start_steps`` > 0 drops results whose trainer nonce is below it (P2P checkpoints
    only; the caller decides).
    """
    plan = ApplyPlan()
    for batch in batch_ids:
        candidates = list(candidates_by_batch.get(batch, ()))
        if not candidates:
            plan.skipped.append((batch, SkipReason.NO_COMMITMENT))
            continue
        chosen = select_consensus_commitment(
            [c.data_hash for c in candidates], broadcast_blooms, quorum
        )
        if chosen is None:
            plan.skipped.append((batch, SkipReason.NO_QUORUM))
            continue
        candidate = candidates[chosen]
        if candidate.trainer_nonce < cold_start_steps:
            plan.skipped.append((batch, SkipReason.COLD_START))
            continue
        plan.apply.append((batch, candidate))
    return plan
