"""Pure health-check selection (reference §2.10, coordinator §5.5–5.6).

At the start of a round, a client that was a witness in the previous round accuses every
trainer of the previous round that fewer than a quorum of that round's witnesses saw in their
participant blooms. Accusing a healthy client makes the coordinator reject the whole message,
so the test here must be exactly the coordinator's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from psyche_client.round.consensus import BloomLike
from psyche_client.round.witness_builder import participant_key


def health_score(client_id: bytes, participant_blooms: Sequence[BloomLike]) -> int:
    key = participant_key(client_id)
    return sum(1 for bloom in participant_blooms if bloom.contains(key))


def clients_to_accuse(
    client_ids: Sequence[bytes],
    is_trainer: Callable[[int], bool],
    participant_blooms: Sequence[BloomLike],
    quorum: int,
    proof_for: Callable[[int], Any],
) -> list[tuple[bytes, Any]]:
    """``(client id, committee proof)`` for every trainer whose health score is below quorum.

    ``client_ids`` are the previous round's clients in committee-index order; ``is_trainer``
    and ``proof_for`` come from that round's committee selection.
    """
    accused: list[tuple[bytes, Any]] = []
    for index, client_id in enumerate(client_ids):
        if not is_trainer(index):
            continue
        if health_score(client_id, participant_blooms) < quorum:
            accused.append((client_id, proof_for(index)))
    return accused
