"""Who verifies what in a round, and how many verifiers must agree (pure; no I/O).

A client whose committee is `Verifier` in a round trains nothing; it checks the batches of its
group (`verifier_groups`: the round's verifiers in groups of 3 to 5, or all of them when they
are fewer than 6), `VERIFIER_SAMPLES` per group member, picked by `verifier_sample` from the
round's sample seed (`Round.sample_seed`), so that the coordinator can check that an
accusation names a batch the accuser really had to check, and so that every checked batch has
two or more checkers whenever the round has two or more verifiers: one verifier's word on a
batch is never all the coordinator hears of it. The sample seed is fresh server
randomness that stays hidden until the round enters RoundWitness (only its hash,
`Round.sample_commit`, is broadcast before), so a trainer cannot know, when it publishes,
whether its batch will be checked; verifiers recompute every batch of the round on the round's
weights and score their sample once it is revealed. `checkers_of` lists the verifiers whose
sample holds one of a trainer's batches. A trainer is convicted once `MIN_ACCUSERS` different
verifiers each had standing accusations of it at `MIN_STRIKE_STEPS` different steps of an
epoch, and a verifier loses its standing once `REFUTERS` other verifiers outvoted it on the
results of `REFUTED_TRAINERS` trainers (`accusations`; docs/verification.md weighs the numbers).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from psyche_common.batch_id import BatchId
from psyche_common.coordinator.assignment import ClientLike, committee_members
from psyche_common.coordinator.committee import Committee
from psyche_common.coordinator.state import CoordinatorState

VERIFIER_SAMPLES = 2
"""Batches per verifier of a group that the group checks each round (all of them when the
round has fewer)."""

GROUP_SIZE = 3
"""Verifiers per group (`verifier_groups`): a round's verifiers are dealt into
`max(1, len // GROUP_SIZE)` groups, so every group but a round's only one has 3 to 5."""

SAMPLE_DOMAIN = b"psyche-py/verifier-sample/v1\x00"
GROUP_DOMAIN = b"psyche-py/verifier-group/v1\x00"


def verifier_groups(sample_seed: bytes, verifiers: Sequence[bytes]) -> list[list[bytes]]:
    """The round's verifiers dealt into groups that check the same batches: shuffled by the
    hidden `sample_seed` (nobody knows their group before the round's results are committed),
    then dealt round-robin into `max(1, len(verifiers) // GROUP_SIZE)` groups. Every check of
    a round with two or more verifiers therefore has at least two verifiers on it: a lone
    accusation is never the only report on its batch unless its co-checkers stay silent."""
    unique = sorted(set(verifiers))
    shuffled = sorted(unique, key=lambda v: hashlib.sha256(GROUP_DOMAIN + sample_seed + v).digest())
    count = max(1, len(shuffled) // GROUP_SIZE)
    return [shuffled[g::count] for g in range(count)] if shuffled else []


def verifier_sample(
    sample_seed: bytes,
    verifier_id: bytes,
    batches: Sequence[BatchId],
    verifiers: Sequence[bytes],
) -> list[BatchId]:
    """The batches `verifier_id` must check: those of its group (`verifier_groups` of the
    round's `verifiers`), `VERIFIER_SAMPLES` per member of the group, chosen by hashing the
    round's revealed `sample_seed` with the group's number; returned sorted by start. Empty
    for a key that is not one of `verifiers`."""
    groups = verifier_groups(sample_seed, verifiers)
    number = next((g for g, group in enumerate(groups) if verifier_id in group), None)
    if number is None:
        return []
    ordered = sorted(batches)
    scored = sorted(
        ordered,
        key=lambda batch: hashlib.sha256(
            SAMPLE_DOMAIN
            + sample_seed
            + number.to_bytes(4, "little")
            + batch.start.to_bytes(8, "little")
            + batch.end.to_bytes(8, "little")
        ).digest(),
    )
    return sorted(scored[: VERIFIER_SAMPLES * len(groups[number])])


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
    sample_seed: bytes,
) -> list[bytes]:
    """The verifiers whose sample holds at least one of `trainer_id`'s batches."""
    batches = list(assignments)
    mine = {batch for batch, owner in assignments.items() if owner == trainer_id}
    return [
        v
        for v in verifiers
        if mine.intersection(verifier_sample(sample_seed, v, batches, verifiers))
    ]


def revealed_sample_seed(coord: CoordinatorState, step: int) -> bytes | None:
    """The sample seed of the round of `step` once the coordinator `coord` revealed it (the
    current round from its RoundWitness on, the previous round), else None."""
    current = coord.current_round()
    if step == coord.progress.step:
        round_ = current
    else:
        previous = coord.previous_round()
        if step + 1 != coord.progress.step or previous is None:
            return None
        round_ = previous
    return round_.sample_seed if round_.sample_revealed and round_.sample_seed else None


MIN_ACCUSERS = 2
"""Different verifiers whose standing accusations convict a trainer: one never does."""

MIN_STRIKE_STEPS = 2
"""Different steps of the epoch that a trainer's standing accusations must come from before
they convict it. Verifiers are deterministic, so one honest result that fails the check by bad
luck (about one tiny-batch check in a hundred) is accused by every verifier that samples it;
such failures are rare and independent from step to step, while a cheat fails every checked
round."""

REFUTERS = 2
"""Different verifiers that must have outvoted a verifier before it loses its standing: passers
that outnumbered its accusation of a result, or accusers that outnumbered its pass of one. One
could be a liar, and a tie decides nothing."""

REFUTED_TRAINERS = 2
"""Different trainers whose results a verifier must have been outvoted on before it loses its
standing: a liar contradicts the others about every trainer it lies about, while colluders
that outnumber an honest checker of their cheat's result outvote it about that one trainer."""
