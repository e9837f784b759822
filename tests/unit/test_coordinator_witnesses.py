"""Warmup witnesses, round witnesses, health checks, checkpoint messages and the quorum table
(spec §4.2, §5.3–5.6, §6 and the edge cases of §8.1)."""

from __future__ import annotations

import pytest
from psyche_common.config import (
    DummyCheckpoint,
    GcsCheckpoint,
    HubCheckpoint,
    P2PCheckpoint,
    P2PGcsCheckpoint,
)
from psyche_common.coordinator import (
    MAX_WITNESSES,
    ClientState,
    CoordinatorError,
    ErrorKind,
    RunState,
    Witness,
    witness_quorum,
)
from psyche_common.coordinator.assignment import assign_data_for_round
from psyche_common.coordinator.checkpoints import merge_uploaded
from psyche_common.coordinator.committee import (
    Committee,
    CommitteeProof,
    CommitteeSelection,
    WitnessProof,
)

from tests.support.coordinators import (
    ids,
    make_coordinator,
    round_witness_for,
    round_witnesses,
    start_epoch,
    to_round_train,
    warmup_witness_for,
    witness_round,
)

A, B, C, D, E = ids(5)


def kind_of(call) -> ErrorKind:
    with pytest.raises(CoordinatorError) as excinfo:
        call()
    return excinfo.value.kind


# ----- quorum -----


def test_witness_quorum_table() -> None:
    table = [witness_quorum(w, 0) for w in range(1, 33)]
    assert table == [
        1, 2, 2, 2, 3, 4, 4, 5, 6, 6, 7, 8, 8, 9, 10, 10,
        11, 12, 12, 13, 14, 14, 15, 16, 16, 17, 18, 18, 19, 20, 20, 21,
    ]  # fmt: skip
    assert witness_quorum(0, 7) == witness_quorum(7, 0) == 4  # 0 means "as many as stored"
    assert witness_quorum(5, 1) == 3  # a set witness_nodes wins over the stored count
    assert witness_quorum(0, 0) == 1  # the reference panics here


# ----- warmup witnesses -----


def test_late_warmup_witness_is_ignored() -> None:
    coord = make_coordinator()
    to_round_train(coord, [A, B])
    before = coord.to_wire()
    coord.warmup_witness(A, warmup_witness_for(coord, A), 1010, 5)
    assert coord.to_wire() == before


def test_warmup_witness_in_wrong_state_or_halted() -> None:
    coord = make_coordinator()
    assert kind_of(lambda: coord.warmup_witness(A, Witness(WitnessProof(0, 0, False)), 1, 1)) == (
        ErrorKind.InvalidRunState
    )
    coord.run_state = RunState.Finished
    assert kind_of(lambda: coord.warmup_witness(A, Witness(WitnessProof(0, 0, False)), 1, 1)) == (
        ErrorKind.Halted
    )


def test_duplicate_warmup_witness() -> None:
    coord = make_coordinator(witness_nodes=0, min_clients=3, init_min_clients=3)
    start_epoch(coord, [A, B, C])
    coord.warmup_witness(A, warmup_witness_for(coord, A), 1001, 1)
    assert kind_of(lambda: coord.warmup_witness(A, warmup_witness_for(coord, A), 1001, 1)) == (
        ErrorKind.DuplicateWitness
    )


@pytest.mark.parametrize("index", [1, 7, 2**40])
def test_warmup_witness_must_name_its_sender(index: int) -> None:
    # The reference stores any index and later panics on an out-of-range one.
    coord = make_coordinator(witness_nodes=0)
    start_epoch(coord, [A, B])
    bad = Witness(WitnessProof(0, index, False))
    assert kind_of(lambda: coord.warmup_witness(A, bad, 1001, 1)) == ErrorKind.InvalidWitness
    assert coord.current_round().witnesses == []
    coord.warmup_witness(A, warmup_witness_for(coord, A), 1001, 1)  # still works afterwards


def test_warmup_witness_indices_follow_departures() -> None:
    coord = make_coordinator(witness_nodes=0, min_clients=2, init_min_clients=3)
    start_epoch(coord, [A, B, C])
    coord.warmup_witness(C, warmup_witness_for(coord, C), 1001, 1)  # stored with index 2
    coord.withdraw(0)
    coord.tick([B, C], 1002, 0)  # A leaves: C is now index 1
    assert coord.current_round().witnesses[0].proof.index == 1
    assert kind_of(lambda: coord.warmup_witness(C, warmup_witness_for(coord, C), 1002, 1)) == (
        ErrorKind.DuplicateWitness
    )
    coord.warmup_witness(B, warmup_witness_for(coord, B), 1003, 9)
    assert coord.run_state == RunState.RoundTrain


def test_warmup_witness_of_a_departed_client_no_longer_counts() -> None:
    coord = make_coordinator(witness_nodes=0, min_clients=2, init_min_clients=3)
    start_epoch(coord, [A, B, C])
    coord.warmup_witness(A, warmup_witness_for(coord, A), 1001, 1)
    coord.withdraw(0)
    coord.tick([B, C], 1002, 0)
    assert coord.current_round().witnesses == []


# ----- round witnesses -----


def test_round_witness_ends_training_early() -> None:
    coord = make_coordinator(witness_nodes=1)
    now = to_round_train(coord, [A, B])
    (elected,) = round_witnesses(coord)
    coord.witness(elected, round_witness_for(coord, elected, [A, B]), now + 1)
    assert coord.run_state == RunState.RoundWitness
    assert coord.run_state_start_unix_timestamp == now + 1


def test_round_witness_arriving_in_witness_phase_is_stored() -> None:
    coord = make_coordinator(witness_nodes=0, min_clients=3, init_min_clients=3)
    now = to_round_train(coord, [A, B, C])
    coord.tick([A, B, C], now + 5, 0)
    assert coord.run_state == RunState.RoundWitness
    for client_id in (A, B, C):
        coord.witness(client_id, round_witness_for(coord, client_id, [A, B, C]), now + 6)
    assert len(coord.current_round().witnesses) == 3
    assert coord.run_state == RunState.RoundWitness


def test_round_witness_rejections() -> None:
    coord = make_coordinator(witness_nodes=1)
    assert kind_of(lambda: coord.witness(A, Witness(WitnessProof(0, 0, True)), 1)) == (
        ErrorKind.InvalidRunState
    )
    now = to_round_train(coord, [A, B, C])
    (elected,) = round_witnesses(coord)
    other = next(i for i in (A, B, C) if i != elected)
    good = round_witness_for(coord, elected, [A, B, C])
    # Someone else's valid proof, a non-witness's proof, a forged position, bad indices.
    assert kind_of(lambda: coord.witness(other, good, now)) == ErrorKind.InvalidWitness
    not_elected = round_witness_for(coord, other)
    assert not not_elected.proof.witness
    assert kind_of(lambda: coord.witness(other, not_elected, now)) == ErrorKind.InvalidWitness
    for proof in (
        WitnessProof(good.proof.position + 1, good.proof.index, True),
        WitnessProof(good.proof.position, 99, True),
    ):
        forged = Witness(proof, good.participant_bloom, good.broadcast_bloom)
        assert kind_of(lambda f=forged: coord.witness(elected, f, now)) == ErrorKind.InvalidWitness
    coord.witness(elected, good, now)
    assert kind_of(lambda: coord.witness(elected, good, now)) == ErrorKind.DuplicateWitness
    coord.run_state = RunState.Paused
    assert kind_of(lambda: coord.witness(elected, good, now)) == ErrorKind.Halted


def test_witnesses_full() -> None:
    coord = make_coordinator(witness_nodes=1)
    now = to_round_train(coord, [A, B])
    (elected,) = round_witnesses(coord)
    filler = Witness(WitnessProof(0, 10_000, True))
    coord.current_round().witnesses = [filler] * MAX_WITNESSES
    coord.run_state = RunState.RoundWitness
    witness = round_witness_for(coord, elected, [A, B])
    assert kind_of(lambda: coord.witness(elected, witness, now)) == ErrorKind.WitnessesFull


def test_participant_scores_sum_to_client_count() -> None:
    # validate_all_clients_participate_in_witness_bloom: 5 clients, batch 5, 1 witness.
    members = [A, B, C, D, E]
    coord = make_coordinator(
        min_clients=5, init_min_clients=5, global_batch_size_start=5, global_batch_size_end=5
    )
    now = to_round_train(coord, members)
    now = witness_round(coord, now)
    now = witness_round(coord, now)
    assert coord.epoch_state.rounds_head == 2
    witnesses = coord.epoch_state.rounds[1].witnesses
    assert sum(coord.trainer_health_score(i, witnesses) for i in members) == 5


# ----- health checks -----


def previous_witnesses(coord) -> list[bytes]:
    """Ids of the previous round's elected witnesses (those entitled to accuse)."""
    selection = CommitteeSelection.from_coordinator(coord, -1)
    previous = coord.previous_round()
    return [
        c.id
        for i, c in enumerate(coord.epoch_state.clients[: previous.clients_len])
        if selection.get_witness(i).witness
    ]


def health_setup(seen_last_round: list[bytes]):
    """Four clients at height 2; round 1's witness saw only `seen_last_round`."""
    members = [A, B, C, D]
    coord = make_coordinator(min_clients=2, init_min_clients=4, global_batch_size_start=8,
                             global_batch_size_end=8)  # fmt: skip
    now = to_round_train(coord, members)
    now = witness_round(coord, now)
    now = witness_round(coord, now, seen=seen_last_round)
    assert coord.current_round().height == 2
    selection = CommitteeSelection.from_coordinator(coord, -1)
    proofs = {c.id: selection.get_committee(i) for i, c in enumerate(coord.epoch_state.clients)}
    return coord, proofs


def test_health_check_before_height_two_is_rejected() -> None:
    coord = make_coordinator()
    now = to_round_train(coord, [A, B])
    witness_round(coord, now)
    assert coord.current_round().height == 1
    assert kind_of(lambda: coord.health_check(A, [])) == ErrorKind.InvalidHealthCheck


def test_health_check_drops_unseen_trainers() -> None:
    coord, proofs = health_setup(seen_last_round=[A, B])
    (W,) = previous_witnesses(coord)
    assert all(p.committee == Committee.Trainer for p in proofs.values())
    dropped = coord.health_check(W, [(C, proofs[C]), (D, proofs[D])])
    assert dropped == 2
    states = {c.id: c.state for c in coord.epoch_state.clients}
    assert states == {A: ClientState.Healthy, B: ClientState.Healthy,
                      C: ClientState.Dropped, D: ClientState.Dropped}  # fmt: skip
    assert coord.health_check(W, [(C, proofs[C])]) == 0  # not counted twice


def test_a_trainer_given_no_batch_is_not_judged_unseen() -> None:
    """Five trainers and a global batch of 3: two trainers get no batch, have no result for a
    witness to see, and accusing them is refused (the reference dropped them every round);
    a trainer that had a batch and was not seen is still dropped."""
    members = [A, B, C, D, E]
    coord = make_coordinator(min_clients=2, init_min_clients=5, global_batch_size_start=3,
                             global_batch_size_end=3)  # fmt: skip
    now = to_round_train(coord, members)
    now = witness_round(coord, now, seen=[])
    now = witness_round(coord, now, seen=[])
    attested = coord.previous_previous_round()
    assert attested is not None
    owners = set(assign_data_for_round(attested, coord.epoch_state.clients, coord.config,
                                       coord.model.max_seq_len).values())  # fmt: skip
    idle = [m for m in members if m not in owners]
    assert len(owners) == 3 and len(idle) == 2
    selection = CommitteeSelection.from_coordinator(coord, -1)
    proofs = {c.id: selection.get_committee(i) for i, c in enumerate(coord.epoch_state.clients)}
    (W,) = previous_witnesses(coord)
    with pytest.raises(CoordinatorError, match="accused healthy client"):
        coord.health_check(W, [(idle[0], proofs[idle[0]])])
    busy = sorted(owners)[0]
    assert coord.health_check(W, [(busy, proofs[busy])]) == 1


def test_health_check_accusing_a_healthy_client_rejects_everything() -> None:
    coord, proofs = health_setup(seen_last_round=[A, B])
    (W,) = previous_witnesses(coord)
    assert kind_of(lambda: coord.health_check(W, [(C, proofs[C]), (B, proofs[B])])) == (
        ErrorKind.InvalidHealthCheck
    )
    assert all(c.state == ClientState.Healthy for c in coord.epoch_state.clients)


def test_health_check_with_bad_proofs() -> None:
    coord, proofs = health_setup(seen_last_round=[A, B])
    (W,) = previous_witnesses(coord)
    wrong_owner = [(D, proofs[C])]
    forged = [(C, CommitteeProof(Committee.Trainer, (proofs[C].position + 1) % 4, proofs[C].index))]
    out_of_range = [(C, CommitteeProof(Committee.Trainer, 0, 17))]
    huge = [(C, CommitteeProof(Committee.Trainer, 0, 2**63))]
    for checks in (wrong_owner, forged, out_of_range, huge):
        assert kind_of(lambda c=checks: coord.health_check(W, c)) == ErrorKind.InvalidCommitteeProof
    assert all(c.state == ClientState.Healthy for c in coord.epoch_state.clients)


def test_health_check_of_an_exited_client_is_rejected_without_crashing() -> None:
    # D left at the last witness timeout: it is in exited_clients, at the tail.
    coord2, proofs2 = health_setup(seen_last_round=[A, B, C])
    (W2,) = previous_witnesses(coord2)
    coord2.epoch_state.clients[3].state = ClientState.Withdrawn
    coord2.move_clients_to_exited(1)
    assert coord2.get_client_at_historical_index(3, 4).id == D
    assert kind_of(lambda: coord2.health_check(W2, [(D, proofs2[D])])) == (
        ErrorKind.InvalidCommitteeProof
    )


def test_health_check_when_halted() -> None:
    coord, proofs = health_setup(seen_last_round=[A, B])
    (W,) = previous_witnesses(coord)
    coord.run_state = RunState.Paused
    assert kind_of(lambda: coord.health_check(W, [(C, proofs[C])])) == ErrorKind.Halted


def test_health_check_only_from_a_witness_of_the_previous_round() -> None:
    """A member that was no witness of the judged round cannot get trainers dropped, even
    with a true accusation; the witness can. A key outside the epoch cannot either."""
    coord, proofs = health_setup(seen_last_round=[A, B])
    (witness,) = previous_witnesses(coord)
    checks = [(C, proofs[C]), (D, proofs[D])]
    for accuser in [m for m in (A, B, C, D) if m != witness] + [E]:
        with pytest.raises(CoordinatorError) as excinfo:
            coord.health_check(accuser, checks)
        assert excinfo.value.kind == ErrorKind.InvalidHealthCheck
        assert "not a witness of the previous round" in str(excinfo.value)
        assert accuser[:4].hex() in str(excinfo.value)
    assert all(c.state == ClientState.Healthy for c in coord.epoch_state.clients)
    assert coord.health_check(witness, checks) == 2


# ----- checkpoint messages -----


def test_checkpoint_message_table() -> None:
    hub, gcs = HubCheckpoint(repo_id="new", revision="abc"), GcsCheckpoint(bucket="nb")
    p2p, p2pgcs = P2PCheckpoint(repo_id="old"), P2PGcsCheckpoint(bucket="ob")
    cases = [
        (p2p, hub, P2PCheckpoint(repo_id="new", revision="abc")),
        (p2pgcs, gcs, P2PGcsCheckpoint(bucket="nb")),
        (HubCheckpoint(repo_id="old"), hub, HubCheckpoint(repo_id="new", revision="abc")),
        (GcsCheckpoint(bucket="ob"), gcs, GcsCheckpoint(bucket="nb")),
        (p2pgcs, hub, P2PCheckpoint(repo_id="new", revision="abc")),
        (p2p, gcs, P2PGcsCheckpoint(bucket="nb")),
        (HubCheckpoint(repo_id="old"), gcs, HubCheckpoint(repo_id="old")),
        (DummyCheckpoint(repo_id=""), hub, DummyCheckpoint(repo_id="")),
        (p2p, DummyCheckpoint(repo_id="x"), p2p),
    ]
    for current, received, expected in cases:
        assert merge_uploaded(current, received) == expected


def test_checkpoint_message_needs_a_member() -> None:
    coord = make_coordinator(model={"checkpoint": {"P2P": {"repo_id": "old"}}})
    start_epoch(coord, [A, B])
    checkpointers = {A, B}
    for index in (1, 2, -1):
        assert (
            kind_of(
                lambda i=index: coord.checkpoint(A, i, HubCheckpoint(repo_id="new"), checkpointers)
            )
            == ErrorKind.InvalidCommitteeProof
        )
    assert coord.model.checkpoint == HubCheckpoint(repo_id="old")  # fresh members: no P2P
    coord.checkpoint(A, 0, HubCheckpoint(repo_id="new"), checkpointers)
    assert coord.model.checkpoint == HubCheckpoint(repo_id="new")
    coord.model.checkpoint = P2PCheckpoint(repo_id="old")
    coord.checkpoint(B, 1, HubCheckpoint(repo_id="newer", revision="c0ffee"), checkpointers)
    assert coord.model.checkpoint == P2PCheckpoint(repo_id="newer", revision="c0ffee")


def test_checkpoint_message_only_from_the_named_checkpointers() -> None:
    coord = make_coordinator(model={"checkpoint": {"Hub": {"repo_id": "org/run"}}})
    start_epoch(coord, [A, B])
    redirect = HubCheckpoint(repo_id="evil/run")
    for checkpointers in (set(), {B}):
        with pytest.raises(CoordinatorError) as excinfo:
            coord.checkpoint(A, 0, redirect, checkpointers)
        assert excinfo.value.kind == ErrorKind.NotCheckpointer
        assert A[:4].hex() in str(excinfo.value) and "--checkpointer" in str(excinfo.value)
    assert coord.model.checkpoint == HubCheckpoint(repo_id="org/run")
    coord.checkpoint(B, 1, HubCheckpoint(repo_id="org/run", revision="c0ffee"), {B})
    assert coord.model.checkpoint == HubCheckpoint(repo_id="org/run", revision="c0ffee")


def test_a_false_accuser_is_removed_at_its_second_refused_health_check() -> None:
    coord, proofs = health_setup(seen_last_round=[A, B])
    (W,) = previous_witnesses(coord)
    for attempt in (1, 2):
        assert kind_of(lambda: coord.health_check(W, [(B, proofs[B])])) == (
            ErrorKind.InvalidHealthCheck
        )
        assert coord.verification.false_reports == {W: attempt}
        state = next(c.state for c in coord.epoch_state.clients if c.id == W)
        # one refusal could be a stale view; the second removes the accuser
        assert state == (ClientState.Healthy if attempt == 1 else ClientState.Dropped)
    accused = next(c for c in coord.epoch_state.clients if c.id == B)
    assert accused.state == ClientState.Healthy
    coord.verification.new_epoch()
    assert coord.verification.false_reports == {}


def test_a_refused_health_check_of_a_non_member_counts_nothing() -> None:
    coord, proofs = health_setup(seen_last_round=[A, B])
    stranger = b"\x42" * 32
    assert kind_of(lambda: coord.health_check(stranger, [(B, proofs[B])])) == (
        ErrorKind.InvalidHealthCheck
    )
    assert coord.verification.false_reports == {}
