"""Verification on the coordinator: who may accuse, the conviction quorum, the kept record."""

from __future__ import annotations

import pytest
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import (
    Accusation,
    ClientState,
    Coordinator,
    CoordinatorError,
    ErrorKind,
    RunState,
)
from psyche_common.coordinator.assignment import assign_data_for_state
from psyche_common.coordinator.committee import Committee, CommitteeSelection
from psyche_common.coordinator.verdicts import VerificationRecord
from psyche_common.coordinator.verification import (
    checkers_of,
    conviction_quorum,
    round_verifiers,
    verifier_sample,
)

from tests.support.coordinators import ids, make_coordinator, to_round_train, witness_round


def coordinator_in_round(percent: int = 50, members: int = 8, **config: int) -> Coordinator:
    settings = {"global_batch_size_start": 12, "global_batch_size_end": 12, **config}
    coord = make_coordinator(verification_percent=percent, **settings)
    to_round_train(coord, ids(members))
    return coord


def verifiers(coord: Coordinator) -> list[bytes]:
    round_ = coord.current_round()
    return round_verifiers(
        coord.epoch_state.clients,
        round_.random_seed,
        coord.config.witness_nodes,
        coord.config.verification_percent,
    )


def accusation(coord: Coordinator, verifier: bytes, batch: BatchId | None = None) -> Accusation:
    """A valid accusation by `verifier` of the trainer of (the first batch of) its sample."""
    assignments = assign_data_for_state(coord)
    sample = verifier_sample(coord.current_round().random_seed, verifier, list(assignments))
    batch = batch or sample[0]
    return Accusation(coord.progress.step, verifier, assignments[batch], batch, 120)


def test_sample_is_deterministic_distinct_and_depends_on_the_verifier() -> None:
    batches = [BatchId(i * 2, i * 2 + 1) for i in range(6)]
    a = verifier_sample(5, b"a" * 32, batches)
    assert a == verifier_sample(5, b"a" * 32, list(reversed(batches)))
    assert len(a) == len(set(a)) == 2 and set(a) <= set(batches)
    others = {tuple(verifier_sample(5, bytes([i]) * 32, batches)) for i in range(20)}
    assert len(others) > 1
    assert verifier_sample(5, b"a" * 32, batches[:1]) == batches[:1]


@pytest.mark.parametrize(("checkers", "quorum"), [(0, 1), (1, 1), (2, 2), (3, 2), (4, 3)])
def test_conviction_quorum_is_a_strict_majority(checkers: int, quorum: int) -> None:
    assert conviction_quorum(checkers) == quorum


def test_a_verifier_quorum_convicts_and_drops_the_trainer() -> None:
    coord = coordinator_in_round()
    round_ = coord.current_round()
    assignments = assign_data_for_state(coord)
    accused = accusation(coord, verifiers(coord)[0]).trainer
    checkers = checkers_of(accused, assignments, verifiers(coord), round_.random_seed)
    quorum = conviction_quorum(len(checkers))
    conviction = None
    for count, checker in enumerate(checkers[:quorum], start=1):
        mine = verifier_sample(round_.random_seed, checker, list(assignments))
        batch = next(b for b in mine if assignments[b] == accused)
        conviction = coord.accuse(
            checker, Accusation(coord.progress.step, checker, accused, batch, 100 + count)
        )
        if count < quorum:
            assert conviction is None
            assert coord.epoch_state.clients[coord.client_index(accused) or 0].state == (
                ClientState.Healthy
            )
    assert conviction is not None
    assert conviction.trainer == accused and conviction.step == coord.progress.step
    assert conviction.agreement_milli == 101
    assert coord.verification.convictions == [conviction]
    index = coord.client_index(accused)
    assert index is not None and coord.epoch_state.clients[index].state == ClientState.Dropped
    assert coord.verification.excluded(accused, coord.progress.epoch, coord.progress.step)
    assert not coord.verification.excluded(accused, coord.progress.epoch, coord.progress.step - 1)
    assert not coord.verification.excluded(accused, coord.progress.epoch + 1, coord.progress.step)


def test_a_one_verifier_check_convicts_on_its_own() -> None:
    coord = coordinator_in_round(percent=25, members=4)
    (verifier,) = verifiers(coord)
    assert coord.accuse(verifier, accusation(coord, verifier)) is not None


def test_only_the_rounds_verifiers_may_accuse() -> None:
    coord = coordinator_in_round()
    trainer = next(c.id for c in coord.epoch_state.clients if c.id not in verifiers(coord))
    valid = accusation(coord, verifiers(coord)[0])
    forged = Accusation(valid.step, trainer, valid.trainer, valid.batch, 0)
    with pytest.raises(CoordinatorError, match="is not a verifier") as info:
        coord.accuse(trainer, forged)
    assert info.value.kind == ErrorKind.InvalidAccusation
    with pytest.raises(CoordinatorError, match="signed as another verifier"):
        coord.accuse(trainer, valid)
    assert coord.verification.accusations == []


def test_an_accusation_must_name_a_sampled_batch_and_its_trainer() -> None:
    coord = coordinator_in_round()
    verifier = verifiers(coord)[0]
    assignments = assign_data_for_state(coord)
    sample = verifier_sample(coord.current_round().random_seed, verifier, list(assignments))
    unsampled = next(b for b in sorted(assignments) if b not in sample)
    with pytest.raises(CoordinatorError, match="did not have to check"):
        coord.accuse(verifier, accusation(coord, verifier, unsampled))
    valid = accusation(coord, verifier)
    other = next(t for t in assignments.values() if t != valid.trainer)
    with pytest.raises(CoordinatorError, match="was not assigned to"):
        coord.accuse(verifier, Accusation(valid.step, verifier, other, valid.batch, 0))


def test_an_accusation_is_counted_once() -> None:
    coord = coordinator_in_round(percent=50, members=8)
    verifier = verifiers(coord)[0]
    coord.accuse(verifier, accusation(coord, verifier))
    with pytest.raises(CoordinatorError, match="already accused"):
        coord.accuse(verifier, accusation(coord, verifier))


def test_accusations_close_when_the_next_rounds_witnesses_are_in() -> None:
    coord = coordinator_in_round(percent=25, members=4)
    (verifier,) = verifiers(coord)
    late = accusation(coord, verifier)
    now = witness_round(coord, 2000)  # the next round starts: its RoundTrain still accepts
    assert coord.run_state == RunState.RoundTrain and coord.progress.step == late.step + 1
    assert coord.accuse(verifier, late) is not None
    coord2 = coordinator_in_round(percent=25, members=4)
    (verifier2,) = verifiers(coord2)
    late2 = accusation(coord2, verifier2)
    now = witness_round(coord2, 2000)
    coord2.tick([c.id for c in coord2.epoch_state.clients], now + 60, 0)  # to RoundWitness
    assert coord2.run_state == RunState.RoundWitness
    with pytest.raises(CoordinatorError, match="closed to accusations"):
        coord2.accuse(verifier2, late2)


def test_accusations_outside_a_round_are_refused() -> None:
    coord = make_coordinator(verification_percent=50)
    with pytest.raises(CoordinatorError, match="not in a round"):
        coord.accuse(b"v" * 32, Accusation(1, b"v" * 32, b"t" * 32, BatchId(0, 0), 0))


def test_old_accusations_are_pruned_at_round_starts() -> None:
    coord = coordinator_in_round(percent=50, members=8)
    verifier = verifiers(coord)[0]
    coord.accuse(verifier, accusation(coord, verifier))
    now = witness_round(coord, 2000)
    assert len(coord.verification.accusations) == 1  # still judgeable in this RoundTrain
    witness_round(coord, now)
    assert coord.verification.accusations == []


def test_the_record_survives_the_wire_and_the_state_file() -> None:
    coord = coordinator_in_round(percent=25, members=4)
    (verifier,) = verifiers(coord)
    conviction = coord.accuse(verifier, accusation(coord, verifier))
    assert conviction is not None
    back = Coordinator.from_wire(coord.to_wire())
    assert back.verification == coord.verification
    saved = Coordinator.from_state_file(coord.to_state_file())
    assert saved.verification.convictions == [conviction]
    assert saved.verification.accusations == []  # pending accusations are not saved


def test_states_saved_before_verification_still_load() -> None:
    coord = coordinator_in_round(percent=0, members=4)
    wire = coord.to_wire()
    del wire["verification"]
    assert Coordinator.from_wire(wire).verification == VerificationRecord()
    state_file = coord.to_state_file()
    assert state_file.verification is None
    assert "verification" not in state_file.to_toml_dict()
    assert Coordinator.from_state_file(state_file).verification == VerificationRecord()


def test_a_malformed_record_names_the_field() -> None:
    with pytest.raises(ValueError, match="agreement_milli"):
        VerificationRecord.from_wire(
            {
                "accusations": [
                    {
                        "step": 1,
                        "verifier": b"v" * 32,
                        "trainer": b"t" * 32,
                        "batch": [0, 1],
                        "agreement_milli": 5000,
                    }
                ],
                "convictions": [],
            }
        )


def test_a_convicted_key_is_not_admitted_to_a_later_epoch() -> None:
    coord = coordinator_in_round(percent=25, members=4)
    (verifier,) = verifiers(coord)
    conviction = coord.accuse(verifier, accusation(coord, verifier))
    assert conviction is not None
    coord.withdraw_all()
    coord.run_state = RunState.WaitingForMembers
    coord.run_state_start_unix_timestamp = 0
    members = [c.id for c in coord.epoch_state.clients]
    coord.tick(members, 5000, 0)
    assert coord.run_state == RunState.Warmup
    admitted = [c.id for c in coord.epoch_state.clients]
    assert conviction.trainer not in admitted and len(admitted) == 3


def committees(coord: Coordinator, offset: int) -> dict[bytes, Committee]:
    selection = CommitteeSelection.from_coordinator(coord, offset)
    return {
        c.id: selection.get_committee(i).committee for i, c in enumerate(coord.epoch_state.clients)
    }


def test_a_verifier_of_the_attested_round_is_not_judged_by_its_blooms() -> None:
    """Witnesses stored in round h-1 attest round h-2's results: a member that verified in
    round h-2 and trains in h-1 had nothing to be seen, so accusing it is refused; a trainer of
    both rounds that nobody saw is dropped."""
    coord = coordinator_in_round(percent=25, members=4)
    everyone = [c.id for c in coord.epoch_state.clients]
    now = 1000
    for _ in range(40):
        # this round's witnesses see nobody: their blooms attest the round before
        now = witness_round(coord, now + 1, seen=[])
        if coord.current_round().height < 2:
            continue
        before_last, last = committees(coord, -2), committees(coord, -1)
        switched = [i for i in everyone if before_last[i] == Committee.Verifier]
        both = [i for i in everyone if before_last[i] == last[i] == Committee.Trainer]
        if switched and last[switched[0]] == Committee.Trainer and both:
            break
    else:
        pytest.fail("no round where a verifier became a trainer")
    selection = CommitteeSelection.from_coordinator(coord, -1)
    proof_of = {c.id: selection.get_committee(i) for i, c in enumerate(coord.epoch_state.clients)}
    accuser = everyone[0]
    with pytest.raises(CoordinatorError, match="accused healthy client"):
        coord.health_check(accuser, [(switched[0], proof_of[switched[0]])])
    assert coord.health_check(accuser, [(both[0], proof_of[both[0]])]) == 1


def test_with_verifiers_no_health_check_across_a_membership_change() -> None:
    coord = coordinator_in_round(percent=25, members=5)
    now = witness_round(coord, 1006, seen=[])
    coord.epoch_state.clients[2].state = ClientState.Dropped  # leaves at the next round start
    now = witness_round(coord, now, seen=[])
    witness_round(coord, now, seen=[])
    previous, attested = coord.previous_round(), coord.previous_previous_round()
    assert previous is not None and attested is not None
    assert previous.clients_len == len(coord.epoch_state.clients) == 4
    assert attested.clients_len == 5  # round h-2's indices name other clients now
    selection = CommitteeSelection.from_coordinator(coord, -1)
    index = next(
        i
        for i in range(len(coord.epoch_state.clients))
        if selection.get_committee(i).committee == Committee.Trainer
    )
    accused = coord.epoch_state.clients[index].id
    accuser = next(  # entitled to accuse: a witness of the previous round
        c.id
        for i, c in enumerate(coord.epoch_state.clients[: previous.clients_len])
        if selection.get_witness(i).witness
    )
    with pytest.raises(CoordinatorError, match="accused healthy client"):
        coord.health_check(accuser, [(accused, selection.get_committee(index))])
