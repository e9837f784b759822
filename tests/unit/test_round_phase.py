"""The (phase, run state) → action table and the prediction of the next round."""

from __future__ import annotations

import pytest
from psyche_client.round.next_round import RoundKey, predict_next_round, round_witness_deadline
from psyche_client.round.phase import ACTIONS, Action, Phase, action_for
from psyche_client.round.roles import derive_round_roles
from psyche_common.coordinator import Coordinator, RunState

from tests.support.coordinators import (
    ids,
    make_coordinator,
    round_witness_for,
    round_witnesses,
    to_round_train,
)

A, B, C = ids(3)


def test_every_phase_and_run_state_has_exactly_one_action() -> None:
    assert set(ACTIONS) == {(phase, state) for phase in Phase for state in RunState}


@pytest.mark.parametrize(
    ("phase", "state", "action"),
    [
        (Phase.IDLE, RunState.Warmup, Action.LOAD_MODEL),
        (Phase.IDLE, RunState.RoundTrain, Action.WAIT),
        (Phase.WARMUP, RunState.RoundTrain, Action.START_ROUND),
        (Phase.WARMUP, RunState.RoundWitness, Action.WAIT),
        (Phase.TRAINING, RunState.RoundTrain, Action.START_ROUND),
        (Phase.TRAINING, RunState.RoundWitness, Action.ENTER_WITNESS),
        (Phase.TRAINING, RunState.Cooldown, Action.START_COOLDOWN),
        (Phase.WITNESS, RunState.RoundWitness, Action.UPDATE_WITNESS),
        (Phase.WITNESS, RunState.RoundTrain, Action.START_ROUND),
        (Phase.WITNESS, RunState.Cooldown, Action.START_COOLDOWN),
        (Phase.COOLDOWN, RunState.WaitingForMembers, Action.LEAVE_EPOCH),
        (Phase.TRAINING, RunState.Paused, Action.LEAVE_EPOCH),
        # pairs the protocol never produces are desyncs, never silent no-ops
        (Phase.COOLDOWN, RunState.RoundTrain, Action.DESYNC),
        (Phase.COOLDOWN, RunState.RoundWitness, Action.DESYNC),
        (Phase.TRAINING, RunState.Uninitialized, Action.DESYNC),
    ],
)
def test_actions(phase: Phase, state: RunState, action: Action) -> None:
    assert action_for(phase, state, is_member=True) == action


def test_a_non_member_leaves_an_epoch_it_was_in_and_otherwise_waits() -> None:
    assert action_for(Phase.TRAINING, RunState.RoundTrain, is_member=False) == Action.LEAVE_EPOCH
    assert action_for(Phase.WITNESS, RunState.RoundWitness, is_member=False) == Action.LEAVE_EPOCH
    assert action_for(Phase.WARMUP, RunState.RoundTrain, is_member=False) == Action.WAIT
    assert action_for(Phase.IDLE, RunState.Warmup, is_member=False) == Action.WAIT


def witnessed_round(witness_count: int | None = None, round_witness_time: float = 2) -> Coordinator:
    """A 3-client round in RoundWitness with `witness_count` of its 2 witnesses in (all)."""
    coord = make_coordinator(witness_nodes=2, round_witness_time=round_witness_time)
    now = to_round_train(coord, [A, B, C])
    elected = round_witnesses(coord)
    for client in elected if witness_count is None else elected[:witness_count]:
        coord.witness(client, round_witness_for(coord, client, [A, B, C]), now)
    if coord.run_state != RunState.RoundWitness:
        coord.tick([A, B, C], now + coord.config.max_round_train_time, 0)
    assert coord.run_state == RunState.RoundWitness
    return coord


@pytest.mark.parametrize("round_witness_time", [2, 0.2])
def test_the_next_round_is_predicted_once_every_witness_is_in(round_witness_time: float) -> None:
    coord = witnessed_round(round_witness_time=round_witness_time)
    predicted = predict_next_round(coord)
    assert predicted is not None
    assert predicted.run_state == RunState.RoundTrain
    assert predicted.progress.step == coord.progress.step + 1
    assert predicted.current_round().random_seed == coord.current_round().next_random_seed
    # the real coordinator, ticked at the deadline with any seed, starts the same round
    real = coord.copy()
    deadline = round_witness_deadline(coord)
    assert deadline == coord.run_state_start_ms / 1000 + round_witness_time
    real.tick([A, B, C], deadline - 0.001, 12345)
    assert real.run_state == RunState.RoundWitness
    real.tick([A, B, C], deadline, 12345)
    for client in (A, B, C):
        expected = RoundKey.of(derive_round_roles(real, client, True), True)
        assert RoundKey.of(derive_round_roles(predicted, client, True), True) == expected


def test_no_prediction_while_witnesses_may_still_arrive_or_a_pause_is_pending() -> None:
    assert predict_next_round(witnessed_round(witness_count=1)) is None
    paused = witnessed_round()
    paused.pending_pause = True
    assert predict_next_round(paused) is None
    training = make_coordinator(witness_nodes=2)
    to_round_train(training, [A, B, C])
    assert predict_next_round(training) is None


def test_a_joiner_loads_then_follows_the_rounds_from_its_round_and_leaves_at_cooldown() -> None:
    """Mid-epoch joins (`round.joiner`): a non-member in a run that admits them loads its model
    while rounds run (when no member is needed for it), a joiner loads it in any case, follows
    the rounds from its `since_height` as a member does, and leaves at the Cooldown."""
    train, witness = RunState.RoundTrain, RunState.RoundWitness
    assert action_for(Phase.IDLE, train, False, may_join=True) == Action.LOAD_MODEL
    assert action_for(Phase.IDLE, train, False) == Action.WAIT
    assert action_for(Phase.IDLE, witness, False, is_joiner=True) == Action.LOAD_MODEL
    assert action_for(Phase.WARMUP, train, False, is_joiner=True) == Action.WAIT
    assert action_for(Phase.WARMUP, train, False, is_joiner=True, follows=True) == (
        Action.START_ROUND
    )
    assert action_for(Phase.TRAINING, witness, False, is_joiner=True, follows=True) == (
        Action.ENTER_WITNESS
    )
    assert action_for(Phase.TRAINING, RunState.Cooldown, False, is_joiner=True, follows=True) == (
        Action.LEAVE_EPOCH
    )
