"""Who verifies what in a round, and how many verifiers must agree (pure; no I/O).

A client whose committee is `Verifier` in a round trains nothing; it recomputes the gradients
of `VERIFIER_SAMPLES` of the round's batches, picked by `verifier_sample` from the round's seed
and the verifier's own id, so that the coordinator can check that an accusation names a batch
the accuser really had to check, and trainers cannot know in advance which batches are
checked. `checkers_of` lists the verifiers whose sample holds one of a trainer's batches. A
trainer is convicted once accusations of `MIN_ACCUSERS` different verifiers, made at
`MIN_STRIKE_STEPS` different steps, stood in an epoch, and an accuser loses its standing once
`REFUTERS` other verifiers passed results it accused (`accusations`; docs/verification.md
weighs the numbers).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from psyche_common.batch_id import BatchId
from psyche_common.coordinator.assignment import ClientLike, committee_members
from psyche_common.coordinator.committee import Committee

VERIFIER_SAMPLES = 2
"""Batches each verifier recomputes per round (fewer when the round has fewer batches)."""

SAMPLE_DOMAIN = b"psyche-py/verifier-sample/v1\x00"


def verifier_sample(
    seed: int, verifier_id: bytes, batches: Sequence[BatchId], count: int = VERIFIER_SAMPLES
) -> list[BatchId]:
    """`count` distinct batches of `batches` (sorted by start), chosen by hashing the round's
    `seed` with the verifier's id; returned in sample order."""
    ordered = sorted(batches)
    scored = sorted(
        ordered,
        key=lambda batch: hashlib.sha256(
            SAMPLE_DOMAIN
            + (seed & ((1 << 64) - 1)).to_bytes(8, "little")
            + verifier_id
            + batch.start.to_bytes(8, "little")
            + batch.end.to_bytes(8, "little")
        ).digest(),
    )
    return sorted(scored[: max(0, count)])


def round_verifiers(
    clients: Sequence[ClientLike],
    seed: int,
    witness_nodes: int,
    verification_percent: int,
    tie_breaker_tasks: int = 0,
) -> list[bytes]:
    """The ids of the round's `Verifier` committee, in client-index order."""
    return committee_members(
        Committee.Verifier, clients, seed, witness_nodes, verification_percent, tie_breaker_tasks
    )


def checkers_of(
    trainer_id: bytes,
    assignments: Mapping[BatchId, bytes],
    verifiers: Sequence[bytes],
    seed: int,
) -> list[bytes]:
    """The verifiers whose sample holds at least one of `trainer_id`'s batches."""
    batches = list(assignments)
    mine = {batch for batch, owner in assignments.items() if owner == trainer_id}
    return [v for v in verifiers if mine.intersection(verifier_sample(seed, v, batches))]


MIN_ACCUSERS = 2
"""Different verifiers whose standing accusations convict a trainer: one never does."""

MIN_STRIKE_STEPS = 2
"""Different steps of the epoch that a trainer's standing accusations must come from before
they convict it. Verifiers are deterministic, so one honest result that fails the check by bad
luck (about one tiny-batch check in a hundred) is accused by every verifier that samples it;
such failures are rare and independent from step to step, while a cheat fails every checked
round."""

REFUTERS = 2
"""Different verifiers that must pass results an accuser accused before it loses standing:
one could be a liar shielding a cheat, so it only cancels the accusation (a tie)."""
