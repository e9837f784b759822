"""Knowing the next round before it starts (pure; no I/O).

While a round's witnesses report (RoundWitness), what the next round does is mostly decided
already: the coordinator published its seed when the current round began, and once every
elected witness has reported, the set of results that the next round applies is final. The
coordinator is a pure state machine, so a client can run it forward on a copy to the moment
RoundWitness times out and read the next round's number, height, data and members from it.

`predict_next_round` does that, and only when the prediction's inputs are final (all witnesses
in, no pause pending). Events during RoundWitness can still change the real outcome (a health
check or a disconnect removes a member, an operator pauses, the epoch times out): the runner
compares the real next round with the prediction (`RoundKey`, `witnesses_key`) and discards
or reverts what it did early when they differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psyche_common.batch_id import BatchId
from psyche_common.config import seconds_to_ms
from psyche_common.coordinator import Coordinator, RunState, Witness
from psyche_common.coordinator.committee import CommitteeProof, WitnessProof

from psyche_client.round.roles import RoundRoles


def round_witness_deadline(coordinator: Coordinator) -> float:
    """The moment (unix seconds) at which the current RoundWitness can first time out."""
    duration_ms = max(seconds_to_ms(coordinator.config.round_witness_time), 1)
    return (coordinator.run_state_start_ms + duration_ms) / 1000


def predict_next_round(coordinator: Coordinator) -> Coordinator | None:
    """The coordinator as the next RoundTrain will start it, or None when that is not yet
    certain enough to act on (not in RoundWitness, witnesses still missing, a pause pending,
    or the epoch ends instead)."""
    if coordinator.run_state != RunState.RoundWitness or coordinator.pending_pause:
        return None
    if len(coordinator.current_round().witnesses) < coordinator.witness_nodes_effective():
        return None
    predicted = coordinator.copy()
    predicted.tick(None, round_witness_deadline(coordinator), 0)
    if predicted.run_state != RunState.RoundTrain:
        return None
    return predicted


def witnesses_key(witnesses: list[Witness]) -> list[dict[str, Any]]:
    """What identifies a round's witness set for the apply that depends on it."""
    return [witness.to_wire() for witness in witnesses]


@dataclass(frozen=True)
class RoundKey:
    """Everything a client's work in a round depends on (equal keys: the same work)."""

    step: int
    height: int
    have_training: bool
    my_batches: tuple[BatchId, ...]
    assignments: tuple[tuple[BatchId, bytes], ...]
    committee: CommitteeProof | None
    witness: WitnessProof | None

    @classmethod
    def of(cls, roles: RoundRoles, have_training: bool) -> RoundKey:
        return cls(
            step=roles.step,
            height=roles.height,
            have_training=have_training,
            my_batches=roles.my_batches,
            assignments=tuple(sorted(roles.assignments.items(), key=lambda item: item[0].start)),
            committee=roles.committee_proof,
            witness=roles.witness_proof,
        )
