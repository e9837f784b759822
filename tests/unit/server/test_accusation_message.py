"""The `Accusation` and `Attestation` client messages: parsed strictly, applied to the
coordinator, judged when their step closes, logged and saved."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from psyche_common.config import load_state
from psyche_common.coordinator import ClientState, ConvictionKind, Coordinator, CoordinatorError
from psyche_common.coordinator.assignment import assign_data_for_state
from psyche_common.coordinator.verification import round_verifiers, verifier_sample
from psyche_common.protocol import InvalidMessage, parse_client_message, to_wire
from psyche_common.protocol.messages import Accusation, Attestation
from psyche_server.client_messages import ConvictionLog, apply_client_message
from psyche_server.persistence import save_state

from tests.support.coordinators import (
    close_step,
    ids,
    make_coordinator,
    reveal_sample,
    shared_batch,
    to_round_train,
)

COMMITMENT = b"\xc1" * 32


def round_with_one_verifier() -> tuple[Coordinator, bytes, Accusation]:
    coord = make_coordinator(verification_percent=25)
    to_round_train(coord, ids(4))
    round_ = coord.current_round()
    (verifier,) = round_verifiers(
        coord.epoch_state.clients, round_.random_seed, 1, 25, round_.tie_breaker_tasks
    )
    assignments = assign_data_for_state(coord)
    batch = verifier_sample(round_.sample_seed, verifier, list(assignments), [verifier])[0]
    message = Accusation(
        step=coord.progress.step,
        trainer=assignments[batch],
        batch=batch.to_wire(),
        agreement_milli=40,
        commitment=COMMITMENT,
    )
    reveal_sample(coord)
    return coord, verifier, message


def test_reports_round_trip_and_bad_fields_are_refused() -> None:
    _, _, message = round_with_one_verifier()
    assert parse_client_message(to_wire(message)) == message
    old = {k: v for k, v in to_wire(message).items() if k != "commitment"}
    assert parse_client_message(old) == message.model_copy(update={"commitment": None})
    for field, bad in (("agreement_milli", 1001), ("batch", [1]), ("trainer", b"x")):
        with pytest.raises(InvalidMessage, match=f"Accusation.{field}"):
            parse_client_message({**to_wire(message), field: bad})
    passed = Attestation(**{**message.model_dump(exclude={"type"}), "agreement_milli": 950})
    assert parse_client_message(to_wire(passed)) == passed
    with pytest.raises(InvalidMessage, match=r"Attestation\.commitment"):
        parse_client_message({**to_wire(passed), "commitment": None})


def test_one_verifiers_accusation_is_recorded_but_convicts_nobody() -> None:
    coord, verifier, message = round_with_one_verifier()
    apply_client_message(coord, verifier, message, 1000.0)
    assert len(coord.verification.accusations) == 1
    close_step(coord, 2000)
    assert coord.verification.convictions == []
    index = coord.client_index(message.trainer)
    assert index is not None and coord.epoch_state.clients[index].state == ClientState.Healthy


def test_two_verifiers_accusations_convict_are_logged_and_saved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    coord = make_coordinator(
        verification_percent=50, global_batch_size_start=12, global_batch_size_end=12
    )
    to_round_train(coord, ids(8))
    batch, (first, second, *_) = shared_batch(coord, 2)
    trainer = assign_data_for_state(coord)[batch]
    # a strike of an earlier step: one step's accusations never convict by themselves
    earlier = coord.progress.step - 1
    coord.verification.strikes = {trainer: {first: {earlier}, second: {earlier}}}
    reveal_sample(coord)
    convictions = ConvictionLog(coord.verification)
    for verifier in (first, second):
        message = Accusation(
            step=coord.progress.step,
            trainer=trainer,
            batch=batch.to_wire(),
            agreement_milli=30,
            commitment=COMMITMENT,
        )
        apply_client_message(coord, verifier, message, 1000.0)
    close_step(coord, 3000)
    caplog.set_level(logging.WARNING)
    convictions.log_new(coord.verification)
    convictions.log_new(coord.verification)  # once
    logged = [r for r in caplog.records if r.getMessage().startswith("conviction:")]
    assert len(logged) == 1 and getattr(logged[0], "conviction_kind", "") == "verifiers"
    path = save_state(coord, tmp_path)
    loaded = Coordinator.from_state_file(load_state(path))
    (conviction,) = loaded.verification.convictions
    assert conviction.trainer == trainer and conviction.kind == ConvictionKind.VERIFIERS


def test_a_report_from_anyone_else_is_refused() -> None:
    coord, verifier, message = round_with_one_verifier()
    other = next(c.id for c in coord.epoch_state.clients if c.id != verifier)
    with pytest.raises(CoordinatorError, match="not a verifier"):
        apply_client_message(coord, other, message, 1000.0)
    passed = Attestation(**{**message.model_dump(exclude={"type"}), "agreement_milli": 950})
    with pytest.raises(CoordinatorError, match="not a verifier"):
        apply_client_message(coord, other, passed, 1000.0)
    assert coord.verification.accusations == coord.verification.attestations == []


def test_a_reversed_batch_is_an_invalid_message() -> None:
    coord, verifier, message = round_with_one_verifier()
    bad = message.model_copy(update={"batch": [5, 1]})
    with pytest.raises(InvalidMessage, match=r"Accusation\.batch"):
        apply_client_message(coord, verifier, bad, 1000.0)
