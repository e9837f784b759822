"""Builders shared by the coordinator tests: configs, coordinators, ids and real witnesses."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from typing import Any

from psyche_common.bloom import Bloom
from psyche_common.config import CoordinatorConfig, LLMConfig
from psyche_common.coordinator import Coordinator, RunState, Witness
from psyche_common.coordinator.committee import CommitteeSelection, WitnessProof

BASE_CONFIG: dict[str, Any] = {
    "warmup_time": 5,
    "cooldown_time": 5,
    "max_round_train_time": 5,
    "round_witness_time": 2,
    "global_batch_size_warmup_tokens": 0,
    "epoch_time": 60,
    "total_steps": 100,
    "init_min_clients": 2,
    "min_clients": 2,
    "witness_nodes": 1,
    "global_batch_size_start": 4,
    "global_batch_size_end": 4,
    "verification_percent": 0,
    "waiting_for_members_extra_time": 3,
}

BASE_MODEL: dict[str, Any] = {
    "max_seq_len": 512,
    "cold_start_warmup_steps": 0,
    "architecture": "HfLlama",
    "checkpoint": {"Hub": {"repo_id": "builtin:llama-tiny"}},
    "data_type": "Pretraining",
    "data_location": "Dummy",
    "lr_schedule": {"Constant": {"base_lr": 1e-3, "warmup_init_lr": 0.0, "warmup_steps": 1}},
    "optimizer": "Dummy",
}


def make_config(**overrides: Any) -> CoordinatorConfig:
    return CoordinatorConfig.model_validate({**BASE_CONFIG, **overrides})


def make_model(**overrides: Any) -> LLMConfig:
    return LLMConfig.model_validate({**BASE_MODEL, **overrides})


def make_coordinator(model: dict[str, Any] | None = None, **config: Any) -> Coordinator:
    return Coordinator(
        run_id="test",
        run_state=RunState.WaitingForMembers,
        model=make_model(**(model or {})),
        config=make_config(**config),
    )


def ids(n: int, salt: str = "client") -> list[bytes]:
    return [hashlib.sha256(f"{salt}-{i}".encode()).digest() for i in range(n)]


def participant_key(client_id: bytes) -> bytes:
    return hashlib.sha256(client_id).digest()


def warmup_witness_for(coord: Coordinator, client_id: bytes) -> Witness:
    index = coord.client_index(client_id)
    assert index is not None
    return Witness(proof=WitnessProof(position=index, index=index, witness=False))


def round_witnesses(coord: Coordinator) -> list[bytes]:
    """Ids of the current round's elected witnesses."""
    selection = CommitteeSelection.from_coordinator(coord, 0)
    clients = coord.epoch_state.clients
    return [c.id for i, c in enumerate(clients) if selection.get_witness(i).witness]


def round_witness_for(
    coord: Coordinator,
    client_id: bytes,
    seen: Iterable[bytes] = (),
    commitments: Iterable[bytes] = (),
    rng: random.Random | None = None,
) -> Witness:
    """A witness with a valid proof; `seen` go into the participant bloom."""
    index = coord.client_index(client_id)
    assert index is not None
    proof = CommitteeSelection.from_coordinator(coord, 0).get_witness(index)
    rng = rng or random.Random(index)
    participant = Bloom.random(rng)
    participant.add_all(participant_key(i) for i in seen)
    broadcast = Bloom.random(rng)
    broadcast.add_all(commitments)
    return Witness(proof, participant, broadcast, hashlib.sha256(b"merkle").digest())


def start_epoch(coord: Coordinator, members: list[bytes], now: int = 1000) -> int:
    """WaitingForMembers → Warmup with `members`; returns the time of the transition."""
    coord.run_state_start_unix_timestamp = 0
    coord.tick(members, now, 0)
    assert coord.run_state == RunState.Warmup
    return now


def to_round_train(coord: Coordinator, members: list[bytes], now: int = 1000, seed: int = 7) -> int:
    start_epoch(coord, members, now)
    now += coord.config.warmup_time
    coord.tick(members, now, seed)
    assert coord.run_state == RunState.RoundTrain
    return now


def witness_round(coord: Coordinator, now: int, seen: Iterable[bytes] | None = None) -> int:
    """All elected witnesses report (seeing `seen`, default: every client) and the round's
    RoundWitness phase times out; returns the new time."""
    everyone = [c.id for c in coord.epoch_state.clients]
    seen_ids = list(everyone if seen is None else seen)
    for witness_id in round_witnesses(coord):
        coord.witness(witness_id, round_witness_for(coord, witness_id, seen_ids), now)
    if coord.run_state == RunState.RoundTrain:
        now += coord.config.max_round_train_time
        coord.tick(everyone, now, 0)
    assert coord.run_state == RunState.RoundWitness
    now += coord.config.round_witness_time
    coord.tick(everyone, now, now)
    return now
