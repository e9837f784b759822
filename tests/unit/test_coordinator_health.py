"""The health score the coordinator and the clients share (`psyche_common.coordinator.health`)."""

from __future__ import annotations

from psyche_common.bloom import Bloom
from psyche_common.coordinator import Witness, health_score
from psyche_common.coordinator.committee import WitnessProof
from psyche_common.coordinator.health import participant_key

from tests.support.coordinators import make_coordinator

A, B = bytes([1]) * 32, bytes([2]) * 32


def blooms_holding(*ids_per_bloom: tuple[bytes, ...]) -> list[Bloom]:
    blooms = []
    for ids in ids_per_bloom:
        bloom = Bloom.random()
        for client_id in ids:
            bloom.add(participant_key(client_id))
        blooms.append(bloom)
    return blooms


def test_health_score_counts_the_blooms_holding_the_participant_key() -> None:
    blooms = blooms_holding((A, B), (A,), ())
    assert health_score(A, blooms) == 2
    assert health_score(B, blooms) == 1
    assert health_score(bytes(32), blooms) == 0
    assert health_score(A, []) == 0


def test_the_coordinator_counts_with_the_same_function() -> None:
    blooms = blooms_holding((A, B), (A,), ())
    witnesses = [
        Witness(WitnessProof(position=i, index=i, witness=True), participant_bloom=bloom)
        for i, bloom in enumerate(blooms)
    ]
    coordinator = make_coordinator()
    for client_id in (A, B):
        assert coordinator.trainer_health_score(client_id, witnesses) == health_score(
            client_id, blooms
        )
