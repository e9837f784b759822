"""Refused results (issue 29, the sign-flipper's cost before its conviction): once verifiers
of two different keys have checkable strikes against a trainer, each further result of it
whose accusations stand is applied by no client, though the trainer is not convicted yet."""

from __future__ import annotations

import pytest
from psyche_client.round.consensus import ApplyPlan, Candidate, SkipReason, split_convicted
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import ClientState
from psyche_common.coordinator.verdicts import REFUSED_STEPS, VerificationRecord

from tests.support.coordinators import close_step
from tests.unit.test_verification_rules import (
    coordinator_in_round,
    lone_check,
    report,
    state_of,
)


@pytest.mark.parametrize(
    ("other_checkable", "passed", "refused"),
    [
        (True, False, True),  # a second independent accuser: the failed result is refused
        (False, False, False),  # the other's strike could not be checked: no refusal
        (True, True, False),  # suspected, but this result passed: it is applied
    ],
)
def test_a_second_independent_accusers_standing_accusation_refuses_the_result(
    other_checkable: bool, passed: bool, refused: bool
) -> None:
    coord = coordinator_in_round(percent=25, members=4)
    verifier, batch, trainer, other = lone_check(coord)
    step = coord.progress.step
    coord.verification.strikes = {trainer: {other: {step - 1}}}
    coord.verification.confirmed = {trainer: {other}} if other_checkable else {}
    report(coord, verifier, batch, passed=passed)
    close_step(coord, 2000)
    record = coord.verification
    assert record.convictions == []  # one step each: no conviction yet
    assert state_of(coord, trainer) == ClientState.Healthy
    assert record.refused_at(trainer, step) is refused
    assert not record.refused_at(trainer, step - 1)  # only the judged step
    assert not record.refused_at(other, step)
    assert not record.excluded(trainer, coord.progress.epoch, step)


def test_one_verifier_alone_refuses_nothing_however_often_it_accuses() -> None:
    """A lone liar (or one honest result failing by bad luck, which every checker accuses in
    one step) never makes a refusal by itself."""
    coord = coordinator_in_round(percent=25, members=4)
    verifier, batch, trainer, _ = lone_check(coord)
    step = coord.progress.step
    coord.verification.strikes = {trainer: {verifier: {step - 2, step - 1}}}
    coord.verification.confirmed = {trainer: {verifier}}
    report(coord, verifier, batch, passed=False)
    close_step(coord, 2000)
    assert coord.verification.refused == {}


def test_a_conviction_supersedes_the_refusal() -> None:
    coord = coordinator_in_round(percent=25, members=4)
    verifier, batch, trainer, other = lone_check(coord)
    step = coord.progress.step
    coord.verification.strikes = {trainer: {other: {step - 2, step - 1}, verifier: {step - 1}}}
    coord.verification.confirmed = {trainer: {other, verifier}}
    report(coord, verifier, batch, passed=False)
    close_step(coord, 2000)
    (conviction,) = coord.verification.convictions
    assert conviction.trainer == trainer and conviction.step == step
    assert coord.verification.refused == {}  # `excluded` covers it from this step on
    assert coord.verification.excluded(trainer, coord.progress.epoch, step)


def test_refusals_travel_in_the_broadcast_are_bounded_and_end_with_the_epoch() -> None:
    t, u = b"t" * 32, b"u" * 32
    record = VerificationRecord()
    for step in range(REFUSED_STEPS + 3):
        record.refuse(t, step)
    record.refuse(u, REFUSED_STEPS + 2)
    assert sorted(record.refused) == list(range(3, REFUSED_STEPS + 3))  # the newest kept
    wire = record.to_wire()
    assert wire["refused"][-1] == {"step": REFUSED_STEPS + 2, "trainers": [t, u]}
    assert VerificationRecord.from_wire(wire) == record
    del wire["refused"]  # a coordinator from before refusals
    assert VerificationRecord.from_wire(wire).refused == {}
    assert "refused" not in record.to_toml()  # in-flight steps: a restart drops them
    record.new_epoch(1)
    assert record.refused == {}


@pytest.mark.parametrize(
    ("refused", "message"),
    [
        ({}, "verification.refused must be a list"),
        ([{"step": 1, "trainers": [b"t" * 32]}] * (REFUSED_STEPS + 1), "at most"),
        ([{"step": -1, "trainers": []}], "step"),
        ([{"step": 1, "trainers": [b"short"]}], r"refused\[\].trainers\[\]"),
        ([{"step": 1}], "trainers"),
    ],
)
def test_a_malformed_refusal_list_names_the_field(refused: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VerificationRecord.from_wire({"accusations": [], "convictions": [], "refused": refused})


def test_clients_skip_a_refused_result_and_do_not_wait_for_it() -> None:
    """Every client skips a refused result, chosen by the witnesses or not, for the reason
    logged; a refused batch nobody delivered is no missed result either."""
    t, u = b"t" * 32, b"u" * 32
    record = VerificationRecord(refused={7: {t}})
    chosen, missing, kept = BatchId(0, 1), BatchId(2, 3), BatchId(4, 5)
    plan: ApplyPlan[BatchId] = ApplyPlan()
    plan.apply = [(chosen, Candidate(t, b"c" * 32)), (kept, Candidate(u, b"d" * 32))]
    plan.skipped = [(missing, SkipReason.NO_QUORUM)]
    owners = {chosen: t, missing: t, kept: u}
    out = split_convicted(plan, owners, lambda x: record.refused_at(x, 7), SkipReason.REFUSED)
    assert out.apply == [(kept, Candidate(u, b"d" * 32))]
    assert sorted(out.skipped) == sorted(
        [(chosen, SkipReason.REFUSED), (missing, SkipReason.REFUSED)]
    )
    later = split_convicted(plan, owners, lambda x: record.refused_at(x, 8), SkipReason.REFUSED)
    assert later.apply == plan.apply  # a later step's result is applied
