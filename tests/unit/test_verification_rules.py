"""Verification on the coordinator: who may report, when independent verifiers convict, how
a refuted accuser loses standing, epoch-scoped and proven bans, the kept record."""

from __future__ import annotations

from pathlib import Path

import pytest
from psyche_common.batch_id import BatchId
from psyche_common.config import load_state
from psyche_common.coordinator import (
    Accusation,
    Attestation,
    ClientState,
    ConvictionKind,
    Coordinator,
    CoordinatorError,
    ErrorKind,
    RunState,
)
from psyche_common.coordinator.assignment import assign_data_for_state
from psyche_common.coordinator.committee import Committee, CommitteeSelection
from psyche_common.coordinator.verdicts import VerificationRecord
from psyche_common.coordinator.verification import (
    GROUP_SIZE,
    MIN_ACCUSERS,
    MIN_STRIKE_STEPS,
    REFUTERS,
    round_verifiers,
    verifier_groups,
    verifier_sample,
)

from tests.support.coordinators import (
    close_step,
    everyone,
    ids,
    make_coordinator,
    reveal_sample,
    round_witness_for,
    round_witnesses,
    shared_batch,
    to_round_train,
    witness_round,
)
from tests.support.server_harness import write_state


def coordinator_in_round(percent: int = 50, members: int = 8, **config: int) -> Coordinator:
    settings = {
        "global_batch_size_start": 12,
        "global_batch_size_end": 12,
        "epoch_time": 100_000,
        "total_steps": 100_000,
        **config,
    }
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


def lone_check(coord: Coordinator) -> tuple[bytes, BatchId, bytes, bytes]:
    """At 4 clients / 25 %: the round's one verifier, a batch it checks, that batch's trainer
    and another client (neither)."""
    (verifier,) = verifiers(coord)
    assignments = assign_data_for_state(coord)
    batch = verifier_sample(
        coord.current_round().sample_seed, verifier, list(assignments), verifiers(coord)
    )[0]
    trainer = assignments[batch]
    other = next(c for c in everyone(coord) if c not in (verifier, trainer))
    return verifier, batch, trainer, other


def accusation(coord: Coordinator, verifier: bytes, batch: BatchId | None = None) -> Accusation:
    """A valid accusation by `verifier` of the trainer of (the first batch of) its sample."""
    assignments = assign_data_for_state(coord)
    sample = verifier_sample(
        coord.current_round().sample_seed, verifier, list(assignments), verifiers(coord)
    )
    batch = batch or sample[0]
    reveal_sample(coord)
    return Accusation(coord.progress.step, verifier, assignments[batch], batch, 120)


SEED5 = bytes([5]) * 32


def test_sample_is_deterministic_distinct_and_depends_on_the_verifier() -> None:
    batches = [BatchId(i * 2, i * 2 + 1) for i in range(30)]
    pool = [bytes([i]) * 32 for i in range(7)]  # two groups: 3 and 4 verifiers
    a = verifier_sample(SEED5, pool[0], batches, pool)
    assert a == verifier_sample(SEED5, pool[0], list(reversed(batches)), list(reversed(pool)))
    assert len(a) == len(set(a)) and set(a) <= set(batches)
    samples = {tuple(verifier_sample(SEED5, v, batches, pool)) for v in pool}
    assert len(samples) == 2  # one sample per group
    assert sorted(len(s) for s in samples) == [2 * 3, 2 * 4]
    assert verifier_sample(SEED5, pool[0], batches[:1], pool) == batches[:1]
    assert verifier_sample(SEED5, b"z" * 32, batches, pool) == []  # not a verifier


def test_every_checked_batch_has_two_checkers_once_a_round_has_two_verifiers() -> None:
    batches = [BatchId(i * 2, i * 2 + 1) for i in range(40)]
    for count in range(2, 12):
        pool = [bytes([i]) * 32 for i in range(count)]
        for seed in (SEED5, bytes([6]) * 32):
            groups = verifier_groups(seed, pool)
            assert sorted(v for g in groups for v in g) == sorted(pool)
            assert all(2 <= len(g) <= 2 * GROUP_SIZE - 1 for g in groups)
            checkers: dict[BatchId, int] = {}
            for v in pool:
                for batch in verifier_sample(seed, v, batches, pool):
                    checkers[batch] = checkers.get(batch, 0) + 1
            assert checkers and min(checkers.values()) >= 2


def test_groups_follow_the_hidden_sample_seed() -> None:
    pool = [bytes([i]) * 32 for i in range(9)]
    shapes = {tuple(tuple(g) for g in verifier_groups(bytes([s]) * 32, pool)) for s in range(8)}
    assert len(shapes) > 1


COMMITMENT = b"\xc0" * 32


def report(
    coord: Coordinator, verifier: bytes, batch: BatchId, passed: bool, agreement: int = 100
) -> None:
    trainer = assign_data_for_state(coord)[batch]
    step = coord.progress.step
    reveal_sample(coord)
    if passed:
        coord.attest(verifier, Attestation(step, verifier, trainer, batch, 900, COMMITMENT))
    else:
        coord.accuse(verifier, Accusation(step, verifier, trainer, batch, agreement, COMMITMENT))


def state_of(coord: Coordinator, client_id: bytes) -> ClientState:
    index = coord.client_index(client_id)
    assert index is not None
    return coord.epoch_state.clients[index].state


def test_the_numbers_need_more_than_one_verifier_and_one_step() -> None:
    assert MIN_ACCUSERS >= 2 and REFUTERS >= 2 and MIN_STRIKE_STEPS >= 2


def accuse_at_a_later_step(coord: Coordinator, trainer: bytes, now: int) -> tuple[bytes, int, int]:
    """Run rounds until a verifier samples a batch of `trainer`, and have it accuse it;
    returns the verifier, the step (still open) and the time."""
    for _ in range(200):
        now = witness_round(coord, now + 1)
        assignments = assign_data_for_state(coord)
        for verifier in verifiers(coord):
            sample_seed = coord.current_round().sample_seed
            for batch in verifier_sample(
                sample_seed, verifier, list(assignments), verifiers(coord)
            ):
                if assignments[batch] == trainer:
                    report(coord, verifier, batch, passed=False)
                    return verifier, coord.progress.step, now
    raise AssertionError("no verifier sampled the trainer in 200 rounds")


def test_two_verifiers_in_one_step_convict_nobody() -> None:
    """Verifiers are deterministic: one honest result that fails the check by bad luck is
    accused by every verifier that samples it, so one step's strikes never convict, however
    many verifiers they name. (Before the step rule this convicted the trainer.)"""
    coord = coordinator_in_round(percent=50, members=8)
    batch, (first, second, *_) = shared_batch(coord, 2)
    trainer = assign_data_for_state(coord)[batch]
    step = coord.progress.step
    report(coord, first, batch, passed=False, agreement=101)
    report(coord, second, batch, passed=False, agreement=102)
    close_step(coord, 2000)
    assert coord.verification.convictions == []
    assert coord.verification.strikes == {trainer: {first: {step}, second: {step}}}
    assert state_of(coord, trainer) == ClientState.Healthy
    assert not coord.verification.excluded(trainer, coord.progress.epoch, step)


def test_two_verifiers_each_at_two_steps_convict_and_drop_the_trainer() -> None:
    coord = coordinator_in_round(percent=50, members=8)
    batch, (first, second, *_) = shared_batch(coord, 2)
    trainer = assign_data_for_state(coord)[batch]
    first_step = coord.progress.step
    report(coord, first, batch, passed=False, agreement=101)
    report(coord, second, batch, passed=False, agreement=102)
    now = close_step(coord, 2000) + coord.config.round_witness_time
    assert coord.verification.convictions == []  # one step each
    coord.tick(everyone(coord), now, now)
    again: set[bytes] = set()
    for _ in range(400):  # until each of the two accuses the trainer at a later step too
        assignments = assign_data_for_state(coord)
        for verifier in set(verifiers(coord)) & ({first, second} - again):
            sample = verifier_sample(
                coord.current_round().sample_seed, verifier, list(assignments), verifiers(coord)
            )
            mine = [b for b in sample if assignments[b] == trainer]
            if mine:
                report(coord, verifier, mine[0], passed=False)
                again.add(verifier)
        if again == {first, second}:
            break
        assert coord.verification.convictions == []
        now = witness_round(coord, now + 1)
    assert again == {first, second}
    close_step(coord, now)
    (conviction,) = coord.verification.convictions
    assert conviction.kind == ConvictionKind.VERIFIERS and conviction.trainer == trainer
    assert conviction.step > first_step
    assert set(conviction.verifiers) == {first, second}
    assert state_of(coord, trainer) == ClientState.Dropped
    assert coord.verification.excluded(trainer, coord.progress.epoch, conviction.step)
    assert not coord.verification.excluded(trainer, coord.progress.epoch, conviction.step - 1)
    assert not coord.verification.excluded(trainer, coord.progress.epoch + 1, conviction.step)


@pytest.mark.parametrize("other_steps", [0, 1, 2])
def test_a_verifier_counts_once_its_accusations_stood_at_two_steps(other_steps: int) -> None:
    """A trainer is convicted once two verifiers each struck it at two steps: one verifier at
    many steps never convicts, nor does it with another verifier's single strike (a lone liar
    and one honest result failing by bad luck)."""
    coord = coordinator_in_round(percent=25, members=4)
    verifier, batch, trainer, other = lone_check(coord)
    step = coord.progress.step
    strikes = {verifier: {step - 1}}
    if other_steps:
        strikes[other] = set(range(step - other_steps, step))
    coord.verification.strikes = {trainer: strikes}
    coord.verification.confirmed = {trainer: {other}}  # its earlier strikes were checkable
    report(coord, verifier, batch, passed=False)
    close_step(coord, 2000)
    if other_steps < 2:
        assert coord.verification.convictions == []
        assert coord.verification.strikes[trainer][verifier] == {step - 1, step}
    else:
        (conviction,) = coord.verification.convictions
        assert conviction.trainer == trainer and conviction.step == step
        assert set(conviction.verifiers) == {other, verifier}


def sole_and_other_checks(coord: Coordinator) -> tuple[bytes, BatchId, bytes, BatchId]:
    """A verifier and a batch of its group's sample, and another verifier of its group with
    another batch of that sample (runs rounds until the sample has two batches whose trainers
    are no verifiers)."""
    now = 1000
    for _ in range(60):
        assignments = assign_data_for_state(coord)
        seed = coord.current_round().sample_seed
        samples = {
            v: verifier_sample(seed, v, list(assignments), verifiers(coord))
            for v in verifiers(coord)
        }
        for verifier, sample in samples.items():
            mine = [b for b in sample if assignments[b] not in samples]
            others = [v for v in samples if v != verifier and samples[v] == sample]
            if len(mine) >= 2 and others:
                return verifier, mine[0], others[0], mine[1]
        now = witness_round(coord, now + 1)
    raise AssertionError("no round with a group sample of two trainers' batches")


@pytest.mark.parametrize("others_report", [True, False])
def test_an_accusation_nobody_else_checked_convicts_nobody(others_report: bool) -> None:
    """Issue 29, finding 2 (the sole liar): every checked batch has two or more checkers
    (`verifier_groups`), so a liar's accusation that no other checker of the batch joins
    (they report on other batches only, or a colluder among them stays silent) can be
    neither confirmed nor refuted; it strikes, but it is not *checkable*, so its verifier
    counts toward no conviction, however many steps it accuses at."""
    coord = coordinator_in_round(percent=50, members=8)
    liar, batch, other, other_batch = sole_and_other_checks(coord)
    trainer = assign_data_for_state(coord)[batch]
    honest = next(c for c in everyone(coord) if c not in (liar, other, trainer))
    step = coord.progress.step
    # an honest verifier with checkable strikes at two steps, and the liar's earlier strike
    coord.verification.strikes = {trainer: {honest: {step - 2, step - 1}, liar: {step - 1}}}
    coord.verification.confirmed = {trainer: {honest}}
    report(coord, liar, batch, passed=False)
    if others_report:
        report(coord, other, other_batch, passed=True)
    close_step(coord, 2000)
    assert coord.verification.strikes[trainer][liar] == {step - 1, step}
    assert coord.verification.convictions == []
    assert liar not in coord.verification.confirmed[trainer]
    assert state_of(coord, trainer) == ClientState.Healthy


def test_in_a_round_with_one_verifier_its_accusations_are_checkable() -> None:
    """Where the round elected one verifier (4 clients at 25 %), nothing could have confirmed
    its accusation, and it counts toward a conviction as before (verifiers rotate, so two of
    them still have to accuse at two steps each)."""
    coord = coordinator_in_round(percent=25, members=4)
    verifier, batch, trainer, honest = lone_check(coord)
    step = coord.progress.step
    coord.verification.strikes = {trainer: {honest: {step - 2, step - 1}, verifier: {step - 1}}}
    coord.verification.confirmed = {trainer: {honest}}
    report(coord, verifier, batch, passed=False)
    close_step(coord, 2000)
    (conviction,) = coord.verification.convictions
    assert set(conviction.verifiers) == {honest, verifier}


def test_a_verifier_keeps_only_the_strikes_a_verdict_needs() -> None:
    """A lone accuser's strikes stay bounded however long the epoch: each verifier keeps its
    first `MIN_STRIKE_STEPS` steps."""
    coord = coordinator_in_round(percent=25, members=4)
    (verifier,) = verifiers(coord)
    assignments = assign_data_for_state(coord)
    batch = verifier_sample(
        coord.current_round().sample_seed, verifier, list(assignments), verifiers(coord)
    )[0]
    trainer = assignments[batch]
    kept = set(range(MIN_STRIKE_STEPS))
    coord.verification.strikes = {trainer: {verifier: set(kept)}}
    report(coord, verifier, batch, passed=False)
    close_step(coord, 2000)
    assert coord.verification.strikes == {trainer: {verifier: kept}}
    assert coord.verification.convictions == []


def test_a_single_accuser_never_convicts() -> None:
    """Finding 5: one verifier's accusations convict nobody."""
    coord = coordinator_in_round(percent=25, members=4)
    (liar,) = verifiers(coord)
    assignments = assign_data_for_state(coord)
    batch = verifier_sample(
        coord.current_round().sample_seed, liar, list(assignments), verifiers(coord)
    )[0]
    trainer = assignments[batch]
    report(coord, liar, batch, passed=False)
    close_step(coord, 2000)
    assert coord.verification.convictions == []
    assert coord.verification.strikes == {trainer: {liar: {coord.progress.step - 1}}}  # alone
    assert state_of(coord, trainer) == ClientState.Healthy


def test_strikes_of_two_verifiers_in_different_rounds_convict() -> None:
    coord = coordinator_in_round(percent=25, members=4)
    now = 2000
    accusers: list[bytes] = []
    target = everyone(coord)[0]
    for _ in range(400):
        (verifier,) = verifiers(coord)
        assignments = assign_data_for_state(coord)
        sample = verifier_sample(
            coord.current_round().sample_seed, verifier, list(assignments), verifiers(coord)
        )
        mine = [b for b in sample if assignments[b] == target]
        if mine and accusers.count(verifier) < 2 and len(set(accusers) - {verifier}) < 2:
            report(coord, verifier, mine[0], passed=False)
            accusers.append(verifier)
            if sorted(accusers.count(v) for v in set(accusers)) == [2, 2]:
                break
        now = witness_round(coord, now + 1)
    assert sorted(accusers.count(v) for v in set(accusers)) == [2, 2]
    assert coord.verification.convictions == []  # the last accusation's step is still open
    close_step(coord, now)
    (conviction,) = coord.verification.convictions
    assert conviction.trainer == target and set(conviction.verifiers) == set(accusers)


def test_a_tie_between_an_accusation_and_a_pass_stands_for_nobody() -> None:
    coord = coordinator_in_round(percent=50, members=8)
    batch, (accuser, passer, *_) = shared_batch(coord, 2)
    report(coord, accuser, batch, passed=False)
    report(coord, passer, batch, passed=True)
    close_step(coord, 2000)
    assert coord.verification.strikes == {}
    assert coord.verification.refuted_by == {}  # a tie counts against neither
    assert coord.verification.convictions == []
    assert state_of(coord, accuser) == ClientState.Healthy


def test_an_accuser_the_others_refute_loses_standing_and_is_removed() -> None:
    """Outvoted about a second trainer's results: removed (outvoted about one trainer only,
    it could be an honest checker of a cheat that colluders shield)."""
    coord = coordinator_in_round(percent=50, members=16)
    batch, (liar, *others) = shared_batch(coord, REFUTERS + 1)
    trainer = assign_data_for_state(coord)[batch]
    coord.verification.outvoted_about = {liar: {b"t" * 32}}  # an earlier step's verdict
    report(coord, liar, batch, passed=False)
    for other in others[:REFUTERS]:
        report(coord, other, batch, passed=True)
    close_step(coord, 2000)
    (conviction,) = coord.verification.convictions
    assert conviction.kind == ConvictionKind.FALSE_ACCUSER and conviction.trainer == liar
    assert set(conviction.verifiers) == set(others[:REFUTERS])
    assert state_of(coord, liar) == ClientState.Dropped
    assert state_of(coord, trainer) == ClientState.Healthy
    assert coord.verification.strikes == {}


def test_a_refuted_accuser_loses_its_earlier_strikes_and_its_voice() -> None:
    coord = coordinator_in_round(percent=50, members=16)
    batch, (liar, *others) = shared_batch(coord, REFUTERS + 1)
    # an earlier accusation that stood, and an earlier one that was outvoted
    coord.verification.strikes = {b"t" * 32: {liar: {0}, others[0]: {0}}}
    coord.verification.outvoted_about = {liar: {b"u" * 32}}
    report(coord, liar, batch, passed=False)
    for other in others[:REFUTERS]:
        report(coord, other, batch, passed=True)
    close_step(coord, 2000)
    assert coord.verification.strikes == {b"t" * 32: {others[0]: {0}}}
    with pytest.raises(CoordinatorError, match="no standing"):
        coord.accuse(liar, Accusation(coord.progress.step, liar, b"t" * 32, batch, 0))


@pytest.mark.parametrize("second_trainer", [False, True])
def test_passers_outvoted_by_accusers_lose_standing(second_trainer: bool) -> None:
    """Passers that accusers outnumber (shielding a cheat's result) are outvoted in turn."""
    coord = coordinator_in_round(percent=50, members=16)
    batch, (passer, *accusers) = shared_batch(coord, REFUTERS + 1)
    trainer = assign_data_for_state(coord)[batch]
    if second_trainer:
        coord.verification.outvoted_about = {passer: {b"t" * 32}}
    report(coord, passer, batch, passed=True)
    for accuser in accusers[:REFUTERS]:
        report(coord, accuser, batch, passed=False)
    close_step(coord, 2000)
    assert coord.verification.refuted_by == {passer: set(accusers[:REFUTERS])}
    assert set(coord.verification.strikes[trainer]) == set(accusers[:REFUTERS])
    if not second_trainer:
        assert coord.verification.convictions == []
        return
    (conviction,) = coord.verification.convictions
    assert conviction.kind == ConvictionKind.FALSE_PASSER and conviction.trainer == passer
    assert state_of(coord, passer) == ClientState.Dropped


def test_reports_wait_for_the_sample_to_be_revealed() -> None:
    """The sample seed is hidden (only its commitment broadcast) until the round enters
    RoundWitness; reports before that are refused."""
    coord = coordinator_in_round(percent=50, members=8)
    round_ = coord.current_round()
    assert not round_.sample_revealed and round_.sample_seed
    wire = coord.to_wire()["epoch_state"]["rounds"][coord.epoch_state.rounds_head]
    assert "sample_seed" not in wire and wire["sample_commit"] == round_.sample_commit
    assert Coordinator.from_wire(coord.to_wire()).current_round().sample_seed == b""
    verifier = verifiers(coord)[0]
    assignments = assign_data_for_state(coord)
    batch = verifier_sample(round_.sample_seed, verifier, list(assignments), verifiers(coord))[0]
    early = Accusation(coord.progress.step, verifier, assignments[batch], batch, 0)
    with pytest.raises(CoordinatorError, match="not revealed yet"):
        coord.accuse(verifier, early)
    for witness_id in round_witnesses(coord):
        coord.witness(witness_id, round_witness_for(coord, witness_id, everyone(coord)), 1001)
    if coord.run_state == RunState.RoundTrain:
        coord.tick(everyone(coord), 1001 + coord.config.max_round_train_time, 0)
    assert coord.run_state == RunState.RoundWitness
    seen = Coordinator.from_wire(coord.to_wire()).current_round()
    assert seen.sample_revealed and seen.sample_seed == round_.sample_seed
    coord.accuse(verifier, early)
    tampered = coord.to_wire()
    tampered["epoch_state"]["rounds"][coord.epoch_state.rounds_head]["sample_seed"] = b"x" * 32
    with pytest.raises(ValueError, match="sample_commit"):
        Coordinator.from_wire(tampered)


def test_a_pass_of_another_commitment_refutes_nothing() -> None:
    """An equivocating trainer shows verifiers different results: a pass of one result says
    nothing about an accusation of the other."""
    coord = coordinator_in_round(percent=50, members=16)
    batch, (accuser, *others) = shared_batch(coord, REFUTERS + 1)
    trainer = assign_data_for_state(coord)[batch]
    step = coord.progress.step
    report(coord, accuser, batch, passed=False)
    for other in others[:REFUTERS]:
        coord.attest(other, Attestation(step, other, trainer, batch, 900, b"\xd0" * 32))
    close_step(coord, 2000)
    assert coord.verification.refuted_by == {} and coord.verification.convictions == []


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
    coord = coordinator_in_round(percent=25)
    verifier = verifiers(coord)[0]
    assignments = assign_data_for_state(coord)
    sample = verifier_sample(
        coord.current_round().sample_seed, verifier, list(assignments), verifiers(coord)
    )
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
    with pytest.raises(CoordinatorError, match="already reported"):
        coord.accuse(verifier, accusation(coord, verifier))


def test_accusations_close_when_the_next_rounds_witnesses_are_in() -> None:
    coord = coordinator_in_round(percent=25, members=4)
    (verifier,) = verifiers(coord)
    late = accusation(coord, verifier)
    now = witness_round(coord, 2000)  # the next round starts: its RoundTrain still accepts
    assert coord.run_state == RunState.RoundTrain and coord.progress.step == late.step + 1
    coord.accuse(verifier, late)
    assert coord.verification.accusations == [late]
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


def convict_one(coord: Coordinator) -> bytes:
    """Two verifiers accuse a trainer that an earlier step's strike already names; the step is
    judged (a conviction); returns the trainer."""
    batch, (first, second, *_) = shared_batch(coord, 2)
    trainer = assign_data_for_state(coord)[batch]
    earlier = coord.progress.step - 1
    coord.verification.strikes = {trainer: {first: {earlier}, second: {earlier}}}
    report(coord, first, batch, passed=False)
    report(coord, second, batch, passed=False)
    close_step(coord, 2000)
    return trainer


def test_the_record_survives_the_wire_and_the_state_file() -> None:
    coord = coordinator_in_round(percent=50, members=8)
    convict_one(coord)
    (conviction,) = coord.verification.convictions
    assert coord.verification.strikes and coord.verification.confirmed
    back = Coordinator.from_wire(coord.to_wire())
    assert back.verification == coord.verification
    saved = Coordinator.from_state_file(coord.to_state_file())
    assert saved.verification.convictions == [conviction]
    # pending reports and the epoch's tallies are not saved
    assert saved.verification.accusations == saved.verification.attestations == []
    assert saved.verification.strikes == saved.verification.refuted_by == {}
    assert saved.verification.confirmed == {}


def test_states_saved_before_verification_still_load() -> None:
    coord = coordinator_in_round(percent=0, members=4)
    wire = coord.to_wire()
    del wire["verification"]
    assert Coordinator.from_wire(wire).verification == VerificationRecord()
    state_file = coord.to_state_file()
    assert state_file.verification is None
    assert "verification" not in state_file.to_toml_dict()
    assert Coordinator.from_state_file(state_file).verification == VerificationRecord()


def test_strikes_travel_with_their_steps_and_in_the_old_shape() -> None:
    """Clients of coordinators from before the step rule decode `strikes` as trainer → its
    accusers; a broadcast from such a coordinator (no `strike_steps`) loads its strikes at no
    known step: they count as accusers but as no step."""
    t, a, b = b"t" * 32, b"a" * 32, b"b" * 32
    record = VerificationRecord(strikes={t: {a: {3, 5}, b: {5}}})
    wire = record.to_wire()
    assert wire["strikes"] == {t: [a, b]}
    assert wire["strike_steps"] == {t: {a: [3, 5], b: [5]}}
    assert VerificationRecord.from_wire(wire) == record
    del wire["strike_steps"]
    assert VerificationRecord.from_wire(wire).strikes == {t: {a: set(), b: set()}}


@pytest.mark.parametrize(
    ("strike_steps", "message"),
    [
        ([], "strike_steps must be a map"),
        ({b"t" * 32: {b"a" * 32: [-1]}}, "non-negative integers"),
        ({b"t" * 32: {b"a" * 32: [True]}}, "non-negative integers"),
        ({b"t" * 32: {b"a" * 32: 3}}, "a list of at most"),
        ({b"t" * 32: {b"a" * 32: list(range(2000))}}, "a list of at most"),
        ({b"t" * 32: {b"a": [1]}}, "strike_steps"),
        ({b"t" * 32: []}, "must be a map"),
    ],
)
def test_malformed_strike_steps_name_the_field(strike_steps: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VerificationRecord.from_wire(
            {"accusations": [], "convictions": [], "strike_steps": strike_steps}
        )


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


def admitted_after(coord: Coordinator, members: list[bytes], epoch: int) -> list[bytes]:
    """The members a WaitingForMembers of epoch number `epoch` admits."""
    coord.withdraw_all()
    coord.progress.epoch = epoch
    coord.run_state = RunState.WaitingForMembers
    coord.run_state_start_unix_timestamp = 0
    coord.tick(members, 5000, 0)
    assert coord.run_state == RunState.Warmup
    return [c.id for c in coord.epoch_state.clients]


def test_a_ban_by_verifiers_lasts_one_epoch() -> None:
    coord = coordinator_in_round(percent=50, members=8)
    members = everyone(coord)
    convict_one(coord)
    (conviction,) = coord.verification.convictions
    epoch = coord.progress.epoch
    # a restart in the middle of the epoch continues its number: still out
    assert conviction.trainer not in admitted_after(coord.copy(), members, epoch)
    # the next epoch admits it again, and starts with clean tallies
    admitted = admitted_after(coord, members, epoch + 1)
    assert conviction.trainer in admitted and len(admitted) == 8
    assert coord.verification.strikes == {}


def test_a_proven_conviction_bans_for_good_and_survives_a_restart() -> None:
    coord = coordinator_in_round(percent=50, members=8)
    members = everyone(coord)
    cheat, reporter = members[3], members[5]
    conviction = coord.convict_proven(cheat, coord.progress.step, BatchId(0, 1), reporter)
    assert conviction.kind == ConvictionKind.PROVEN
    assert coord.convict_proven(cheat, coord.progress.step, BatchId(0, 1), reporter) is conviction
    assert state_of(coord, cheat) == ClientState.Dropped
    restarted = Coordinator.from_state_file(coord.to_state_file())
    assert restarted.verification.convictions == [conviction]
    assert cheat not in admitted_after(restarted, members, coord.progress.epoch + 5)


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


OLD_FORMAT_VERIFICATION = """
[verification]
[[verification.convictions]]
epoch = 3
step = 41
trainer = "{trainer}"
batch = [8, 11]
verifiers = ["{verifier}"]
agreement_milli = 12
"""


def test_a_state_file_saved_before_conviction_kinds_loads_with_an_epoch_scoped_ban(
    tmp_path: Path,
) -> None:
    """Files written when one verifier convicted for ever: the conviction loads as a verifier
    conviction of its epoch, so the key is out for that epoch only."""
    convicted, verifier, other = ids(3, salt="old")
    path = write_state(tmp_path / "old.toml", init_min_clients=2)
    path.write_text(
        path.read_text()
        + OLD_FORMAT_VERIFICATION.format(trainer=convicted.hex(), verifier=verifier.hex())
    )
    coord = Coordinator.from_state_file(load_state(path))
    (conviction,) = coord.verification.convictions
    assert conviction.kind == ConvictionKind.VERIFIERS and conviction.trainer == convicted
    assert (conviction.epoch, conviction.step, conviction.batch) == (3, 41, BatchId(8, 11))
    assert coord.verification.banned(convicted, 3)
    assert not coord.verification.banned(convicted, 4)
    resaved = Coordinator.from_state_file(coord.to_state_file())
    assert resaved.verification.convictions == [conviction]
    assert admitted_after(coord, [convicted, other], 4) == [convicted, other]
