"""Pure role derivation: what this client does in the coordinator's current round.

Everything follows from the broadcast coordinator state (reference §2.5.1): the committee and
witness proofs of this client, the round's batch → trainer assignment, this client's own
batches and every batch id of the round (what witnesses wait for).
"""

from __future__ import annotations

from dataclasses import dataclass

from psyche_common.batch_id import BatchId
from psyche_common.coordinator import Coordinator, Round
from psyche_common.coordinator.assignment import assign_data_for_round
from psyche_common.coordinator.committee import (
    Committee,
    CommitteeProof,
    CommitteeSelection,
    WitnessProof,
)
from psyche_common.coordinator.verification import round_verifiers


@dataclass(frozen=True)
class RoundRoles:
    """This client's view of one round."""

    step: int
    height: int
    my_index: int | None
    committee_proof: CommitteeProof | None
    witness_proof: WitnessProof | None
    selection: CommitteeSelection | None
    assignments: dict[BatchId, bytes]
    batch_ids: tuple[BatchId, ...]
    my_batches: tuple[BatchId, ...]
    random_seed: int = 0
    """The round's seed (which clients are its verifiers follows from it)."""
    verifiers: tuple[bytes, ...] = ()
    """The ids of the round's `Verifier` committee (whose groups check which batches follows
    from them and the round's hidden sample seed: `verification.verifier_sample`)."""

    @property
    def is_witness(self) -> bool:
        return self.witness_proof is not None and self.witness_proof.witness

    @property
    def is_verifier(self) -> bool:
        return self.committee_proof is not None and (
            self.committee_proof.committee == Committee.Verifier
        )

    @property
    def is_trainer(self) -> bool:
        return self.committee_proof is not None and (
            self.committee_proof.committee == Committee.Trainer
        )


def selection_for_round(
    coordinator: Coordinator, round_: Round | None
) -> CommitteeSelection | None:
    """The committee selection of a stored round, None when it has no clients."""
    if round_ is None or round_.clients_len == 0:
        return None
    return CommitteeSelection.new(
        round_.tie_breaker_tasks,
        coordinator.config.witness_nodes,
        coordinator.config.verification_percent,
        round_.clients_len,
        round_.random_seed,
    )


def derive_round_roles(
    coordinator: Coordinator, client_id: bytes, have_training: bool
) -> RoundRoles:
    """Roles, proofs and batches of ``client_id`` in the coordinator's current round."""
    round_ = coordinator.current_round()
    clients = list(coordinator.epoch_state.clients)
    selection = selection_for_round(coordinator, round_)
    index = coordinator.client_index(client_id)
    committee_proof = witness_proof = None
    if selection is not None and index is not None and index < selection.total_nodes:
        committee_proof = selection.get_committee(index)
        witness_proof = selection.get_witness(index)
    assignments: dict[BatchId, bytes] = {}
    if have_training and clients:
        assignments = assign_data_for_round(
            round_, clients, coordinator.config, coordinator.model.max_seq_len
        )
    batch_ids = tuple(sorted(assignments, key=lambda b: b.start))
    mine = tuple(b for b in batch_ids if assignments[b] == client_id)
    return RoundRoles(
        step=coordinator.progress.step,
        height=round_.height,
        my_index=index,
        committee_proof=committee_proof,
        witness_proof=witness_proof,
        selection=selection,
        assignments=assignments,
        batch_ids=batch_ids,
        my_batches=mine,
        random_seed=round_.random_seed,
        verifiers=tuple(
            round_verifiers(
                clients,
                round_.random_seed,
                coordinator.config.witness_nodes,
                coordinator.config.verification_percent,
                round_.tie_breaker_tasks,
            )
        )
        if clients
        else (),
    )
