"""The `Accusation` client message: parsed strictly, applied to the coordinator, saved."""

from __future__ import annotations

from pathlib import Path

import pytest
from psyche_common.config import load_state
from psyche_common.coordinator import ClientState, Coordinator, CoordinatorError
from psyche_common.coordinator.assignment import assign_data_for_state
from psyche_common.coordinator.verification import round_verifiers, verifier_sample
from psyche_common.protocol import InvalidMessage, parse_client_message, to_wire
from psyche_common.protocol.messages import Accusation
from psyche_server.client_messages import apply_client_message
from psyche_server.persistence import save_state

from tests.support.coordinators import ids, make_coordinator, to_round_train


def round_with_one_verifier() -> tuple[Coordinator, bytes, Accusation]:
    coord = make_coordinator(verification_percent=25)
    to_round_train(coord, ids(4))
    round_ = coord.current_round()
    (verifier,) = round_verifiers(
        coord.epoch_state.clients, round_.random_seed, 1, 25, round_.tie_breaker_tasks
    )
    assignments = assign_data_for_state(coord)
    batch = verifier_sample(round_.random_seed, verifier, list(assignments))[0]
    message = Accusation(
        step=coord.progress.step,
        trainer=assignments[batch],
        batch=batch.to_wire(),
        agreement_milli=40,
    )
    return coord, verifier, message


def test_an_accusation_round_trips_and_bad_fields_are_refused() -> None:
    _, _, message = round_with_one_verifier()
    assert parse_client_message(to_wire(message)) == message
    for field, bad in (("agreement_milli", 1001), ("batch", [1]), ("trainer", b"x")):
        with pytest.raises(InvalidMessage, match=f"Accusation.{field}"):
            parse_client_message({**to_wire(message), field: bad})


def test_an_accusation_from_the_verifier_convicts_and_is_saved(tmp_path: Path) -> None:
    coord, verifier, message = round_with_one_verifier()
    apply_client_message(coord, verifier, message, 1000.0)
    index = coord.client_index(message.trainer)
    assert index is not None and coord.epoch_state.clients[index].state == ClientState.Dropped
    path = save_state(coord, tmp_path)
    loaded = Coordinator.from_state_file(load_state(path))
    assert [c.trainer for c in loaded.verification.convictions] == [message.trainer]


def test_an_accusation_from_anyone_else_is_refused() -> None:
    coord, verifier, message = round_with_one_verifier()
    other = next(c.id for c in coord.epoch_state.clients if c.id != verifier)
    with pytest.raises(CoordinatorError, match="not a verifier"):
        apply_client_message(coord, other, message, 1000.0)
    assert coord.verification.convictions == []


def test_a_reversed_batch_is_an_invalid_message() -> None:
    coord, verifier, message = round_with_one_verifier()
    bad = message.model_copy(update={"batch": [5, 1]})
    with pytest.raises(InvalidMessage, match=r"Accusation\.batch"):
        apply_client_message(coord, verifier, bad, 1000.0)
