"""Serialization of the coordinator: msgpack broadcast form, state.toml form, reset_ephemeral."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgpack
import pytest
import tomli_w
from psyche_common.config import (
    ConfigError,
    HubCheckpoint,
    P2PCheckpoint,
    load_state,
    parse_state,
)
from psyche_common.coordinator import ClientState, Coordinator, RunState

from tests.support.coordinators import ids, make_coordinator, to_round_train, witness_round

A, B, C = ids(3)
ALLOWED = (dict, list, int, float, str, bytes, bool, type(None))


def busy_coordinator() -> Coordinator:
    """A coordinator in its third round with witnesses, an exited client and a big seed."""
    coord = make_coordinator(min_clients=2, init_min_clients=3)
    now = to_round_train(coord, [A, B, C], seed=2**64 - 1)
    now = witness_round(coord, now)
    coord.withdraw(coord.client_index(C))
    witness_round(coord, now)
    coord.epoch_state.cold_start_epoch = True
    return coord


def assert_msgpack_safe(value: Any, path: str = "") -> None:
    assert isinstance(value, ALLOWED), f"{path} is {type(value).__name__}"
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str), f"{path} has key {key!r}"
            assert_msgpack_safe(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert_msgpack_safe(item, f"{path}[{i}]")


def test_wire_round_trip_through_msgpack() -> None:
    coord = busy_coordinator()
    assert coord.epoch_state.exited_clients and coord.previous_round().witnesses
    data = coord.to_wire()
    assert_msgpack_safe(data)
    packed = msgpack.packb(data)
    decoded = Coordinator.from_wire(msgpack.unpackb(packed))
    assert decoded == coord
    assert decoded.to_wire() == data
    assert isinstance(data["epoch_state"]["clients"][0][0], bytes)
    witness = data["epoch_state"]["rounds"][0]["witnesses"][0]
    assert isinstance(witness["participant_bloom"]["bits"], bytes)


def test_wire_is_compact() -> None:
    coord = make_coordinator()
    to_round_train(coord, ids(256, "crowd"))
    # 256 ids of 32 bytes dominate; the whole state stays far below a frame limit.
    assert len(msgpack.packb(coord.to_wire())) < 256 * 40 + 4000


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("config"), "missing config"),
        (lambda d: d.update(run_state=42), "run_state"),
        (lambda d: d.update(pending_pause="no"), "pending_pause"),
        (lambda d: d["epoch_state"]["clients"].append([b"x", 0, 0]), "client id"),
        (lambda d: d["epoch_state"].update(rounds_head=9), "rounds_head"),
        (lambda d: d["epoch_state"]["rounds"].pop(), "4 rounds"),
        (lambda d: d["progress"].update(step=-1), "progress.step"),
        (lambda d: d["config"].update(witness_nodes="one"), "model/config"),
        (
            lambda d: d["epoch_state"]["rounds"][0]["witnesses"][0]["participant_bloom"].update(
                keys=[1]
            ),
            "8 keys",
        ),
    ],
)
def test_from_wire_rejects_bad_fields(mutate, message: str) -> None:
    data = msgpack.unpackb(msgpack.packb(busy_coordinator().to_wire()))
    mutate(data)
    with pytest.raises(ValueError, match=message):
        Coordinator.from_wire(data)


def test_state_file_round_trip_through_toml_text(tmp_path: Path) -> None:
    coord = busy_coordinator()
    text = tomli_w.dumps(coord.to_state_file().to_toml_dict())
    path = tmp_path / "state.toml"
    path.write_text(text)
    restored = Coordinator.from_state_file(load_state(path))
    assert restored == coord
    assert restored.current_round().random_seed == coord.current_round().random_seed


def test_fixture_state_files_load(shared_fixtures: Path) -> None:
    for path in sorted(shared_fixtures.glob("configs/*/state.toml")):
        coord = Coordinator.from_state_file(load_state(path))
        assert coord.progress.step == 1
        assert coord.epoch_state.clients == []
        assert Coordinator.from_wire(msgpack.unpackb(msgpack.packb(coord.to_wire()))) == coord


def test_bad_epoch_state_in_a_file_is_reported() -> None:
    document = tomllib.loads(tomli_w.dumps(busy_coordinator().to_state_file().to_toml_dict()))
    document["epoch_state"]["clients"][0]["id"] = "zz"
    with pytest.raises(ConfigError) as caught:
        parse_state(document)
    assert [problem.field for problem in caught.value.problems] == ["epoch_state.clients[0].id"]


def test_reset_ephemeral_forgets_connections_but_keeps_the_members() -> None:
    coord = busy_coordinator()
    coord.withdraw(coord.client_index(B))
    coord.reset_ephemeral()
    assert coord.run_state == RunState.WaitingForMembers
    # the Healthy members hold the model: kept for the P2P check; B (withdrawn) and the
    # exited C are forgotten
    assert [(c.id, c.state) for c in coord.epoch_state.clients] == [(A, ClientState.Healthy)]
    assert coord.epoch_state.exited_clients == []
    assert coord.epoch_state.cold_start_epoch  # kept: a paused run re-warms after a restart


def test_reset_ephemeral_of_a_finished_run_stays_finished() -> None:
    coord = make_coordinator(total_steps=5)
    coord.progress.step = 5
    coord.run_state = RunState.Cooldown
    coord.reset_ephemeral()
    assert coord.run_state == RunState.Finished


def restarted_after_an_epoch() -> tuple[Coordinator, Coordinator, int]:
    """A run after one successful epoch of A and B, and a coordinator restarted from it."""
    coord = make_coordinator(epoch_time=20)
    now = to_round_train(coord, [A, B])
    while coord.run_state == RunState.RoundTrain:
        now = witness_round(coord, now)
    coord.tick([A, B], now + 5, 0)
    assert isinstance(coord.model.checkpoint, P2PCheckpoint)
    saved = coord.copy()
    saved.reset_ephemeral()
    restarted = Coordinator.from_state_file(parse_state(saved.to_state_file().to_toml_dict()))
    restarted.reset_ephemeral()
    assert restarted.progress == coord.progress
    return coord, restarted, now


def test_restart_keeps_p2p_when_a_previous_member_rejoins() -> None:
    _, restarted, now = restarted_after_an_epoch()
    restarted.tick([C, B], now + 100, 0)  # B held the model before the restart
    assert restarted.run_state == RunState.Warmup
    assert isinstance(restarted.model.checkpoint, P2PCheckpoint)
    assert [c.id for c in restarted.epoch_state.clients] == [C, B]


def test_restart_falls_back_to_hub_when_no_previous_member_rejoins() -> None:
    _, restarted, now = restarted_after_an_epoch()
    restarted.tick([C, *ids(1, "other")], now + 100, 0)
    assert restarted.run_state == RunState.Warmup
    assert isinstance(restarted.model.checkpoint, HubCheckpoint)
    assert [c.state for c in restarted.epoch_state.clients] == [ClientState.Healthy] * 2
