"""Pure health-check selection (reference §2.10, coordinator §5.5–5.6).

At the start of a round, a client that was a witness in the previous round accuses every
trainer of the previous round that fewer than a quorum of that round's witnesses saw in their
participant blooms. Accusing a healthy client makes the coordinator reject the whole message,
so the score is the coordinator's own (`psyche_common.coordinator.health.health_score`).

`clients_to_accuse` is the honest `AccusationPolicy`; the round pipeline receives its policy
(`RoundRunner(accuse=...)`), so a test or an attack client can give it another one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from psyche_common.coordinator.committee import CommitteeProof
from psyche_common.coordinator.health import health_score

from psyche_client.round.consensus import BloomLike

Proof = TypeVar("Proof")


class AccusationPolicy(Protocol):
    """Which trainers of the previous round a witness accuses in its health check, as
    (client id, committee proof) pairs. The honest policy is `clients_to_accuse`."""

    def __call__(
        self,
        client_ids: Sequence[bytes],
        is_trainer: Callable[[int], bool],
        participant_blooms: Sequence[BloomLike],
        quorum: int,
        proof_for: Callable[[int], CommitteeProof],
    ) -> list[tuple[bytes, CommitteeProof]]: ...


def clients_to_accuse(
    client_ids: Sequence[bytes],
    is_trainer: Callable[[int], bool],
    participant_blooms: Sequence[BloomLike],
    quorum: int,
    proof_for: Callable[[int], Proof],
) -> list[tuple[bytes, Proof]]:
    """``(client id, committee proof)`` for every trainer whose health score is below quorum.

    ``client_ids`` are the previous round's clients in committee-index order; ``is_trainer``
    and ``proof_for`` come from that round's committee selection.
    """
    accused: list[tuple[bytes, Proof]] = []
    for index, client_id in enumerate(client_ids):
        if not is_trainer(index):
            continue
        if health_score(client_id, participant_blooms) < quorum:
            accused.append((client_id, proof_for(index)))
    return accused
