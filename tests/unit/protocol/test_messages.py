"""Message validation: every type round-trips; bad shapes raise InvalidMessage naming the field."""

from __future__ import annotations

import pytest
from psyche_common.protocol import (
    Checkpoint,
    CoordinatorState,
    HealthCheck,
    HealthCheckEntry,
    InvalidMessage,
    Join,
    Rejected,
    WarmupWitness,
    Witness,
    WitnessMetadata,
    decode_payload,
    encode_payload,
    parse_client_message,
    parse_server_message,
    to_wire,
)
from psyche_common.protocol.data_messages import (
    RequestRejected,
    RequestTrainingData,
    TrainingData,
    parse_data_reply,
    parse_data_request,
)

KEY = bytes(range(32))
CLIENT_MESSAGES = [
    Join(run_id="run", p2p_address="127.0.0.1:4000", client_version="0.1"),
    Witness(witness={"proof": {"index": 1}}, metadata=WitnessMetadata(step=3, weights_hash=KEY)),
    Witness(
        witness={"proof": {"index": 1}},
        metadata=WitnessMetadata(step=3, evals={"arc_easy": 0.5, "heldout_loss": 2.25}),
    ),
    WarmupWitness(witness={"proof": {"index": 0}}),
    HealthCheck(checks=[HealthCheckEntry(id=KEY, proof={"index": 2})], step=4),
    HealthCheck(weights_hash=KEY, step=5),
    Checkpoint(checkpoint={"Hub": {"repo_id": "a/b", "revision": None}}),
]


@pytest.mark.parametrize("message", CLIENT_MESSAGES, ids=lambda m: m.type)
def test_client_messages_round_trip_through_msgpack(message: object) -> None:
    wire = decode_payload(encode_payload(to_wire(message)))  # type: ignore[arg-type]
    assert parse_client_message(wire) == message


def test_server_messages_round_trip() -> None:
    for message in (
        CoordinatorState(coordinator={"run_id": "x", "blob": b"\x00"}, peers={KEY: "[::1]:9"}),
        Rejected(reason="wrong run id"),
    ):
        assert parse_server_message(decode_payload(encode_payload(to_wire(message)))) == message


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ([1, 2], "must be a map"),
        ({"type": "Nope"}, "unknown message type 'Nope'"),
        ({"run_id": "r"}, "unknown message type None"),
        ({"type": "Join", "run_id": "r"}, "Join.p2p_address: Field required"),
        ({"type": "Join", "run_id": 7, "p2p_address": "a:1"}, "Join.run_id"),
        ({"type": "Join", "run_id": "r", "p2p_address": "no-port"}, "Join.p2p_address"),
        ({"type": "Join", "run_id": "r", "p2p_address": "a:1", "admin": True}, "Join.admin"),
        ({"type": "Join", "run_id": "r" * 33, "p2p_address": "a:1"}, "Join.run_id"),
        (
            {"type": "HealthCheck", "checks": [{"id": b"short", "proof": {}}]},
            "HealthCheck.checks.id",
        ),
        ({"type": "Witness", "witness": {}, "metadata": {"step": -1}}, "Witness.metadata.step"),
        ({"type": "Witness", "witness": "x", "metadata": {"step": 1}}, "Witness.witness"),
        ({"type": "Checkpoint"}, "Checkpoint.checkpoint"),
    ],
)
def test_invalid_client_messages(frame: object, expected: str) -> None:
    with pytest.raises(InvalidMessage, match=expected.replace(".", r"\.").replace("(", r"\(")):
        parse_client_message(frame)


def test_server_type_is_not_a_client_message() -> None:
    with pytest.raises(InvalidMessage, match="unknown message type 'Rejected'"):
        parse_client_message({"type": "Rejected", "reason": "x"})


def test_data_messages() -> None:
    request = RequestTrainingData(start=3, end=5)
    assert parse_data_request(to_wire(request)) == request
    with pytest.raises(InvalidMessage, match="before start"):
        parse_data_request({"type": "RequestTrainingData", "start": 5, "end": 3})
    reply = TrainingData(start=3, end=4, seq_len=2, tokens=bytes(16))
    assert parse_data_reply(to_wire(reply)) == reply
    with pytest.raises(InvalidMessage, match="expected 16"):
        parse_data_reply({**to_wire(reply), "tokens": bytes(15)})
    rejected = RequestRejected(start=1, end=1, reason="NotInThisRound")
    assert parse_data_reply(to_wire(rejected)) == rejected


def test_witness_without_evals_leaves_the_field_out() -> None:
    bare = to_wire(Witness(witness={}, metadata=WitnessMetadata(step=1)))
    assert "evals" not in bare["metadata"]
    scored = to_wire(Witness(witness={}, metadata=WitnessMetadata(step=1, evals={"t": 1.0})))
    assert scored["metadata"]["evals"] == {"t": 1.0}


@pytest.mark.parametrize(
    "evals",
    [
        {f"t{i}": 0.5 for i in range(9)},  # more than 8 scores
        {"x" * 33: 0.5},  # a name over 32 characters
        {"t": float("nan")},
        {"t": float("inf")},
        {"": 0.5},
    ],
)
def test_witness_evals_are_bounded(evals: dict[str, float]) -> None:
    frame = {"type": "Witness", "witness": {}, "metadata": {"step": 1, "evals": evals}}
    with pytest.raises(InvalidMessage, match="evals"):
        parse_client_message(frame)
