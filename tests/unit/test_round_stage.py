"""A round's stage only moves forward, and only an adopted round that was confirmed is handed
over (`RoundState` transitions, `prepare.Adopted`)."""

from __future__ import annotations

import pytest
from psyche_client.round.prepare import Adopted
from psyche_client.round.roles import RoundRoles
from psyche_client.round.state import RoundStage, RoundState
from psyche_common.bloom import Bloom


def new_round(predicted: bool) -> RoundState:
    roles = RoundRoles(
        step=4,
        height=2,
        my_index=None,
        committee_proof=None,
        witness_proof=None,
        selection=None,
        assignments={},
        batch_ids=(),
        my_batches=(),
    )
    return RoundState.start(roles, 2, True, 0.0, lambda n: Bloom.random(), predicted=predicted)


def test_a_round_trains_then_finishes() -> None:
    round_ = new_round(predicted=False)
    assert round_.stage is RoundStage.TRAINING and round_.confirmed
    with pytest.raises(RuntimeError):
        round_.mark_finished()  # not before its training ended
    round_.end_training(1.0)
    assert round_.stage is RoundStage.TRAINED and round_.training_done
    round_.stop()  # the training time ends after the training: nothing is cancelled
    round_.mark_finished()
    assert round_.stage is RoundStage.FINISHED and not round_.cancelled


def test_a_round_stopped_before_its_training_ended_is_cancelled() -> None:
    round_ = new_round(predicted=False)
    round_.stop()
    assert round_.cancelled
    round_.end_training(1.0)  # the training task notices and ends
    assert round_.cancelled and round_.training_done


def test_a_predicted_round_is_confirmed_once() -> None:
    round_ = new_round(predicted=True)
    assert round_.stage is RoundStage.PREDICTED and not round_.confirmed
    round_.end_training(1.0)  # trained before the real round started
    assert round_.stage is RoundStage.PREDICTED
    round_.confirm()
    assert round_.stage is RoundStage.TRAINED and round_.confirmed
    with pytest.raises(RuntimeError):
        round_.confirm()


def test_only_a_confirmed_round_is_adopted() -> None:
    round_ = new_round(predicted=True)
    with pytest.raises(ValueError, match="must be confirmed"):
        Adopted(round_, None)
    round_.confirm()
    assert Adopted(round_, None).round_ is round_
