"""Pure consensus logic of the apply step (reference §2.9 and coordinator §5.5).

At the start of round h a client applies the results of round h−2. For every batch of that
round it picks the one commitment that a quorum of round h−1's witnesses saw in their
broadcast blooms (`commitment_threshold`: also more than half of the witnesses that reported,
so two commitments of one batch can never both win), and only applies that commitment's
payload. A commitment is the id of a trainer's signed statement
(`ResultAnnouncement.commitment`): it names the exact blob. Nothing here does I/O: the
caller passes the commitments it received (in arrival order), the witnesses' blooms and a
predicate telling whether a payload is ready.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, Protocol, TypeVar

B = TypeVar("B")


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


def commitment_threshold(quorum: int, witnesses: int) -> int:
    """Votes a commitment needs: the witness `quorum`, and more than half of the `witnesses`
    that reported. Each honest witness's broadcast bloom holds one commitment per batch, so
    with this no two commitments of a batch can both have enough votes: a client that knows
    the winner applies it, one that does not knows it missed it (`apply.missed_results`).
    The quorum alone allows two at 4 witnesses (2 of 4 each)."""
    return max(quorum, witnesses // 2 + 1)


class SkipReason(Enum):
    """Why a batch of round h−2 contributes nothing at apply time."""

    NO_COMMITMENT = "untrained batch: no result was announced"
    NO_QUORUM = "no commitment reached the witness quorum"
    COLD_START = "trainer is still in its cold-start warmup"
    CONVICTED = "its trainer was convicted by the round's verifiers"
    EQUIVOCATED = "its trainer signed two different commitments for one batch"
    REFUSED = "its check failed and two verifiers have accused its trainer this epoch"


@dataclass(frozen=True)
class Candidate:
    """One announced result for a batch: who sent it and its commitment (the id of its signed
    statement, `ResultAnnouncement.commitment`)."""

    sender: bytes
    commitment: bytes


class HasTrainerNonce(Protocol):
    @property
    def trainer_nonce(self) -> int: ...


def cold_start_steps(p2p_checkpoint: bool, cold_start_warmup_steps: int) -> int:
    """Results whose trainer nonce is below this are not applied: the trainers' first results
    after the run resumed from a P2P checkpoint (0, nothing skipped, for other checkpoints)."""
    return cold_start_warmup_steps if p2p_checkpoint else 0


R = TypeVar("R", bound=HasTrainerNonce)


def split_cold_start(
    chosen: Sequence[tuple[B, R]], steps: int
) -> tuple[list[tuple[B, R]], list[tuple[B, SkipReason]]]:
    """Split the decoded consensus results into those to apply and those whose trainer is
    still in its cold start (nonce below ``steps``)."""
    kept = [(batch, result) for batch, result in chosen if result.trainer_nonce >= steps]
    skipped = [
        (batch, SkipReason.COLD_START) for batch, result in chosen if result.trainer_nonce < steps
    ]
    return kept, skipped


@dataclass
class ApplyPlan(Generic[B]):
    """What to apply at the start of a round: data hashes in batch order, and what was skipped."""

    apply: list[tuple[B, Candidate]] = field(default_factory=list)
    skipped: list[tuple[B, SkipReason]] = field(default_factory=list)


def plan_apply(
    batch_ids: Sequence[B],
    candidates_by_batch: Mapping[B, Sequence[Candidate]],
    broadcast_blooms: Sequence[BloomLike],
    quorum: int,
) -> ApplyPlan[B]:
    """Choose, per batch (in the given canonical order), the result to apply. A batch's
    candidates are considered in commitment (data hash) order, so the choice depends only on
    the candidate set and the witnesses' blooms.

    Whether the chosen payload is actually present is the caller's business (it waits for the
    download, then treats a still-missing consensus payload as a desync, like the reference).
    A result's trainer nonce is known only once it is decoded: `split_cold_start` then drops
    the cold-start results.
    """
    plan: ApplyPlan[B] = ApplyPlan()
    for batch in batch_ids:
        # commitment order, never arrival order: every client decides alike whichever peers
        # told it first
        candidates = sorted(candidates_by_batch.get(batch, ()), key=lambda c: c.commitment)
        if not candidates:
            plan.skipped.append((batch, SkipReason.NO_COMMITMENT))
            continue
        chosen = select_consensus_commitment(
            [c.commitment for c in candidates], broadcast_blooms, quorum
        )
        if chosen is None:
            plan.skipped.append((batch, SkipReason.NO_QUORUM))
            continue
        plan.apply.append((batch, candidates[chosen]))
    return plan


def split_convicted(
    plan: ApplyPlan[B],
    owners: Mapping[B, bytes],
    excluded: Callable[[bytes], bool],
    reason: SkipReason = SkipReason.CONVICTED,
) -> ApplyPlan[B]:
    """`plan` without the batches whose trainer (`owners`) is `excluded` (convicted, or proven
    to equivocate, for this step or earlier: `reason`): they become skipped, whether a result
    was chosen for them or none arrived, so that nobody waits for or misses a result no one
    applies."""
    kept: ApplyPlan[B] = ApplyPlan()
    for batch, candidate in plan.apply:
        if excluded(candidate.sender):
            kept.skipped.append((batch, reason))
        else:
            kept.apply.append((batch, candidate))
    for batch, why in plan.skipped:
        owner = owners.get(batch)
        out = owner is not None and why not in _EXCLUSIONS and excluded(owner)
        kept.skipped.append((batch, reason if out else why))
    return kept


_EXCLUSIONS = frozenset({SkipReason.CONVICTED, SkipReason.EQUIVOCATED, SkipReason.REFUSED})
