"""`[epoch_state]` and `[verification]` of a saved state.toml are validated at load like the
rest of the file: a real saved state loads and writes back exactly as before, and each
malformed value is refused with the field at fault."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from psyche_common.batch_id import BatchId
from psyche_common.config import ConfigError, load_state, parse_state, verification_table
from psyche_common.config import epoch_state as table
from psyche_common.config.coordinator_rules import MAX_CLIENTS_PER_EPOCH, MAX_WITNESSES_PER_ROUND
from psyche_common.coordinator import Coordinator, verdicts
from psyche_common.coordinator import types as coordinator_types
from psyche_common.coordinator.verdicts import Conviction, ConvictionKind, VerificationRecord

SAVED = Path(__file__).parent / "data" / "saved_state.toml"
"""A state saved by a real `psyche-server run --save-state-dir` mid-epoch (one member, every
round slot with a witness)."""


def saved_document() -> dict[str, Any]:
    return tomllib.loads(SAVED.read_text())


def test_a_real_saved_state_loads_and_writes_back_unchanged(tmp_path: Path) -> None:
    document = saved_document()
    state = load_state(SAVED)
    assert state.to_toml_dict() == document
    coordinator = Coordinator.from_state_file(state)
    assert [client.id.hex() for client in coordinator.epoch_state.clients] == [
        client["id"] for client in document["epoch_state"]["clients"]
    ]
    assert coordinator.to_state_file().to_toml_dict()["epoch_state"] == document["epoch_state"]
    again = tmp_path / "again.toml"
    again.write_text(tomli_w.dumps(coordinator.to_state_file().to_toml_dict()))
    assert Coordinator.from_state_file(load_state(again)) == coordinator


def test_seeds_and_bloom_keys_may_be_integers() -> None:
    document = saved_document()
    round_ = document["epoch_state"]["rounds"][0]
    round_["random_seed"] = int(round_["random_seed"])
    bloom = round_["witnesses"][0]["participant_bloom"]
    bloom["keys"] = [int(key) for key in bloom["keys"]]
    assert parse_state(document).to_toml_dict() == saved_document()


def test_older_states_without_the_next_round_seed_load() -> None:
    document = saved_document()
    for round_ in document["epoch_state"]["rounds"]:
        del round_["next_random_seed"]
    state = parse_state(document)
    assert state.epoch_state is not None
    assert {round_.next_random_seed for round_ in state.epoch_state.rounds} == {0}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set the value at a dotted path of `epoch_state` (numbers index lists)."""

    def mutate(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = document["epoch_state"]
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _delete(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda document: document["epoch_state"].pop(key)


def _one_round_too_few(document: dict[str, Any]) -> None:
    document["epoch_state"]["rounds"].pop()


BAD = [
    (_set("bogus", 1), "epoch_state.bogus"),
    (_set("rounds.0.bogus", 1), "epoch_state.rounds[0].bogus"),
    (_set("rounds_head", 4), "epoch_state.rounds_head"),
    (_set("rounds_head", "0"), "epoch_state.rounds_head"),
    (_delete("start_step"), "epoch_state.start_step"),
    (_set("first_round", 1), "epoch_state.first_round"),
    (_one_round_too_few, "epoch_state.rounds"),
    (_set("rounds.1.random_seed", "-5"), "epoch_state.rounds[1].random_seed"),
    (_set("rounds.1.random_seed", str(2**64)), "epoch_state.rounds[1].random_seed"),
    (_set("rounds.2.height", -1), "epoch_state.rounds[2].height"),
    (_set("rounds.0.witnesses.0.broadcast_merkle", "00"), None),
    (_set("rounds.0.witnesses.0.participant_bloom.bits", "zz"), None),
    (_set("rounds.0.witnesses.0.participant_bloom.keys", ["1"]), None),
    (_set("rounds.0.witnesses.0.proof.witness", 2), None),
    (_set("clients.0.id", "zz"), "epoch_state.clients[0].id"),
    (_set("clients.0.state", "Happy"), "epoch_state.clients[0].state"),
    (_set("clients.0.exited_height", "0"), "epoch_state.clients[0].exited_height"),
]


@pytest.mark.parametrize(("mutate", "field"), BAD)
def test_a_malformed_epoch_state_is_refused_naming_the_field(
    mutate: Callable[[dict[str, Any]], None], field: str | None
) -> None:
    document = copy.deepcopy(saved_document())
    mutate(document)
    with pytest.raises(ConfigError) as caught:
        parse_state(document)
    fields = [problem.field for problem in caught.value.problems]
    assert len(fields) == 1, fields
    assert fields[0].startswith("epoch_state.")
    if field is None:  # a value inside a witness: the path names the witness's field
        field = fields[0]
        assert field.startswith("epoch_state.rounds[0].witnesses[0]."), field
    assert fields[0] == field


def test_the_tables_capacities_are_the_coordinators() -> None:
    assert table.NUM_STORED_ROUNDS == coordinator_types.NUM_STORED_ROUNDS
    assert table.MERKLE_ROOT_LEN == coordinator_types.MERKLE_ROOT_LEN
    assert MAX_CLIENTS_PER_EPOCH == coordinator_types.MAX_CLIENTS
    assert MAX_WITNESSES_PER_ROUND == coordinator_types.MAX_WITNESSES
    assert verification_table.MAX_CONVICTIONS == verdicts.MAX_CONVICTIONS
    assert verification_table.MAX_BANS == verdicts.MAX_BANS


def _with_convictions() -> dict[str, Any]:
    record = VerificationRecord(
        convictions=[
            Conviction(2, 40, b"\x01" * 32, BatchId(8, 11), (b"\x02" * 32, b"\x03" * 32), 120),
            Conviction(
                2, 41, b"\x04" * 32, BatchId(0, 3), (b"\x05" * 32,), 1000, ConvictionKind.PROVEN
            ),
        ]
    )
    document = saved_document()
    document["verification"] = record.to_toml()
    return document


def test_kept_convictions_load_and_write_back_unchanged() -> None:
    document = _with_convictions()
    state = parse_state(document)
    assert state.to_toml_dict() == document
    coordinator = Coordinator.from_state_file(state)
    assert [c.kind for c in coordinator.verification.convictions] == [
        ConvictionKind.VERIFIERS,
        ConvictionKind.PROVEN,
    ]
    # a file from before bans were kept apart: its proven conviction is a ban, and stays one
    assert list(coordinator.verification.bans) == [b"\x04" * 32]
    written = coordinator.to_state_file().to_toml_dict()["verification"]
    assert written == {
        **document["verification"],
        "bans": [document["verification"]["convictions"][1]],
    }
    again = Coordinator.from_state_file(parse_state({**document, "verification": written}))
    assert again.to_state_file().to_toml_dict()["verification"] == written


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("bogus", 1, "verification.convictions[0].bogus"),
        ("trainer", "zz", "verification.convictions[0].trainer"),
        ("batch", [1], "verification.convictions[0].batch"),
        ("verifiers", ["00"], "verification.convictions[0].verifiers[0]"),
        ("agreement_milli", 1001, "verification.convictions[0].agreement_milli"),
        ("kind", "guilty", "verification.convictions[0].kind"),
    ],
)
def test_a_malformed_conviction_is_refused_naming_the_field(
    key: str, value: Any, field: str
) -> None:
    document = _with_convictions()
    document["verification"]["convictions"][0][key] = value
    with pytest.raises(ConfigError) as caught:
        parse_state(document)
    assert [problem.field for problem in caught.value.problems] == [field]


def test_a_verification_table_without_convictions_is_refused() -> None:
    document = saved_document()
    document["verification"] = {"bogus": 1}
    with pytest.raises(ConfigError) as caught:
        parse_state(document)
    assert sorted(problem.field for problem in caught.value.problems) == [
        "verification.bogus",
        "verification.convictions",
    ]
