"""Roles and batches a client derives from the broadcast coordinator state."""

from __future__ import annotations

from psyche_client.round.roles import derive_round_roles
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import Client, Coordinator, Round, RunState
from psyche_common.coordinator.assignment import assign_data_for_round
from psyche_common.coordinator.committee import Committee, CommitteeSelection

from tests.support.coordinators import coordinator_in


def coordinator_at_height_3(
    n_clients: int, batch: int, seed: int = 42, witness_nodes: int = 1
) -> tuple[Coordinator, list[Client], Round]:
    """Round training at step 7, the epoch's fourth round (height 3), whose data starts at
    sample 100; `batch` samples a round, sequences of 16 tokens."""
    members = [bytes([i + 1]) * 32 for i in range(n_clients)]
    coordinator = coordinator_in(
        RunState.RoundTrain,
        members,
        step=7,
        height=3,
        data_index=100 - 3 * batch,
        seed=seed,
        model={"max_seq_len": 16},
        witness_nodes=witness_nodes,
        global_batch_size_start=batch,
        global_batch_size_end=batch,
    )
    round_ = coordinator.current_round()
    assert (round_.height, round_.data_index) == (3, 100)
    return coordinator, list(coordinator.epoch_state.clients), round_


def test_every_client_gets_its_share_and_they_cover_the_batch() -> None:
    coordinator, clients, round_ = coordinator_at_height_3(3, batch=8)
    seen: list[BatchId] = []
    witnesses = 0
    for client in clients:
        roles = derive_round_roles(coordinator, client.id, have_training=True)
        assert roles.step == 7 and roles.height == 3
        assert roles.is_trainer
        assert len(roles.my_batches) == 1
        seen.extend(roles.my_batches)
        assert all(roles.assignments[b] == client.id for b in roles.my_batches)
        witnesses += roles.is_witness
        assert roles.batch_ids == tuple(sorted(roles.assignments, key=lambda b: b.start))
    assert witnesses == 1  # witness_nodes = 1
    assert sorted(len(b) for b in seen) == [2, 3, 3]
    assert min(b.start for b in seen) == 100 and max(b.end for b in seen) == 107
    expected = assign_data_for_round(round_, clients, coordinator.config, 16)
    assert set(seen) == set(expected)


def test_proofs_match_the_committee_selection() -> None:
    coordinator, clients, round_ = coordinator_at_height_3(4, batch=4, seed=9)
    selection = CommitteeSelection.new(0, 1, 0, 4, round_.random_seed)
    for index, client in enumerate(clients):
        roles = derive_round_roles(coordinator, client.id, have_training=True)
        assert roles.my_index == index == coordinator.client_index(client.id)
        assert roles.committee_proof == selection.get_committee(index)
        assert roles.committee_proof.committee == Committee.Trainer
        assert roles.witness_proof == selection.get_witness(index)


def test_flush_round_and_outsider() -> None:
    coordinator, clients, _ = coordinator_at_height_3(2, batch=4)
    roles = derive_round_roles(coordinator, clients[0].id, have_training=False)
    assert roles.assignments == {} and roles.my_batches == () and roles.batch_ids == ()
    outsider = derive_round_roles(coordinator, b"\xff" * 32, have_training=True)
    assert outsider.my_index is None and outsider.committee_proof is None
    assert not outsider.is_witness and outsider.my_batches == ()
