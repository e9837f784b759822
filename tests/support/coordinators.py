"""Real coordinators for tests: configs (`bench.support.run_configs`), a builder that brings a `Coordinator` to a chosen run
state, step, epoch and membership by the transitions a run takes, ids and real witnesses."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from typing import Any

from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom
from psyche_common.config.loading import parse_state
from psyche_common.coordinator import Client, Coordinator, EpochState, RunState, Witness
from psyche_common.coordinator.assignment import assign_data_for_state
from psyche_common.coordinator.committee import CommitteeSelection, WitnessProof
from psyche_common.coordinator.verification import round_verifiers, verifier_sample
from psyche_common.coordinator.wire import epoch_state_to_toml

from bench.support.run_configs import BASE_CONFIG as BASE_CONFIG
from bench.support.run_configs import BASE_MODEL as BASE_MODEL
from bench.support.run_configs import distro_model as distro_model
from bench.support.run_configs import make_config as make_config
from bench.support.run_configs import make_coordinator as make_coordinator
from bench.support.run_configs import make_model as make_model


def state_document(
    *,
    clients: Sequence[bytes] = (),
    step: int = 1,
    epoch: int = 0,
    data_index: int = 0,
    model: dict[str, Any] | None = None,
    run_id: str = "test",
    **config: Any,
) -> dict[str, Any]:
    """A state.toml document (as `tomllib` reads one) of a run waiting for members at `step` of
    `epoch`, whose first batch starts at `data_index`. `clients` are the previous epoch's
    Healthy members (a run after a Cooldown keeps them; with none, a P2P checkpoint falls back
    to its Hub repo when the epoch starts)."""
    document: dict[str, Any] = {
        "run_id": run_id,
        "run_state": RunState.WaitingForMembers.name,
        "config": {**BASE_CONFIG, **config},
        "model": {"LLM": {**BASE_MODEL, **(model or {})}},
        "progress": {"epoch": epoch, "step": step, "epoch_start_data_index": data_index},
    }
    if clients:
        members = EpochState(clients=[Client(client_id) for client_id in clients])
        document["epoch_state"] = epoch_state_to_toml(members)
    return document


def coordinator_in(
    run_state: RunState,
    clients: Sequence[bytes],
    *,
    step: int = 1,
    epoch: int = 0,
    height: int = 0,
    data_index: int = 0,
    checkpoint: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    now: int = 1000,
    seed: int = 7,
    **config: Any,
) -> Coordinator:
    """A real coordinator in `run_state` at `step` of `epoch` whose epoch members are
    `clients`, reached from a state file by ticks and witnesses as a run would be.

    The epoch starts at `step - height` with its first batch at `data_index`; `height` rounds
    are witnessed by all elected witnesses (every client seen) before the round of `step`.
    `checkpoint` is the `[model.LLM.checkpoint]` table (e.g. `{"P2P": {"repo_id": "x"}}`); a
    P2P one survives the epoch start when `epoch` > 0 (the members held the model). `min_clients`
    and `init_min_clients` default to `len(clients)` and `witness_nodes` to 1. In Warmup and the
    round states the state began at the returned coordinator's `run_state_start_unix_timestamp`.
    Cooldown (and Finished) end the round of `step - 1` with `total_steps = step` unless given."""
    target = step
    if height and run_state in (RunState.WaitingForMembers, RunState.Warmup, RunState.Paused):
        raise ValueError(f"{run_state.name} has no round: no height")
    if run_state in (RunState.Cooldown, RunState.Finished):
        config.setdefault("total_steps", step)
        step -= 1
    first_step = step - height
    config.setdefault("min_clients", max(1, len(clients)))
    config.setdefault("init_min_clients", config["min_clients"])
    model = {**(model or {}), **({"checkpoint": checkpoint} if checkpoint else {})}
    previous = clients if epoch > 0 else ()
    document = state_document(
        clients=previous,
        step=first_step,
        epoch=epoch,
        data_index=data_index,
        model=model,
        **config,
    )
    coord = Coordinator.from_state_file(parse_state(document))
    if run_state == RunState.WaitingForMembers:
        return coord
    if run_state == RunState.Paused:
        coord.pause(now)
        return coord
    start_epoch(coord, list(clients), now)
    if run_state == RunState.Warmup:
        return coord
    now = to_round_train(coord, list(clients), now, seed, started=True)
    for _ in range(height):
        now = witness_round(coord, now)
    if run_state == RunState.RoundWitness:
        now += coord.config.max_round_train_time
        coord.tick(list(clients), now, seed)
    elif run_state in (RunState.Cooldown, RunState.Finished):
        now = witness_round(coord, now)
        if run_state == RunState.Finished:
            coord.tick(list(clients), now + coord.config.cooldown_time, seed)
    if (coord.run_state, coord.progress.step) != (run_state, target):
        reached = f"{coord.run_state.name} at step {coord.progress.step}"
        raise ValueError(f"{run_state.name} at step {target} is not reached: {reached}")
    return coord


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


def to_round_train(
    coord: Coordinator,
    members: list[bytes],
    now: int = 1000,
    seed: int = 7,
    *,
    started: bool = False,
) -> int:
    """WaitingForMembers (or, with `started`, Warmup) → RoundTrain; returns the time."""
    if not started:
        start_epoch(coord, members, now)
    now += coord.config.warmup_time
    coord.tick(members, now, seed)
    assert coord.run_state == RunState.RoundTrain
    return now


def witness_round(
    coord: Coordinator,
    now: int,
    seen: Iterable[bytes] | None = None,
    pending: Sequence[bytes] | None = None,
) -> int:
    """All elected witnesses report (seeing `seen`, default: every client) and the round's
    RoundWitness phase times out, with `pending` joined (default: every client); returns the
    new time."""
    everyone = [c.id for c in coord.epoch_state.clients]
    seen_ids = list(everyone if seen is None else seen)
    joined = list(everyone if pending is None else pending)
    for witness_id in round_witnesses(coord):
        coord.witness(witness_id, round_witness_for(coord, witness_id, seen_ids), now)
    if coord.run_state == RunState.RoundTrain:
        now += coord.config.max_round_train_time
        coord.tick(joined, now, 0)
    assert coord.run_state == RunState.RoundWitness
    now += coord.config.round_witness_time
    coord.tick(joined, now, now)
    return now


def everyone(coord: Coordinator) -> list[bytes]:
    return [c.id for c in coord.epoch_state.clients]


def close_step(coord: Coordinator, now: int) -> int:
    """Run rounds until the current step's reports are judged (the next round's witnesses)."""
    now = witness_round(coord, now)
    for witness_id in round_witnesses(coord):
        coord.witness(witness_id, round_witness_for(coord, witness_id, everyone(coord)), now)
    if coord.run_state == RunState.RoundTrain:
        now += coord.config.max_round_train_time
        coord.tick(everyone(coord), now, 0)
    assert coord.run_state == RunState.RoundWitness
    return now


def reveal_sample(coord: Coordinator) -> None:
    """Reveal the current round's verifier sample as its RoundWitness does, without changing
    the run state (rule tests report during the round)."""
    coord.current_round().sample_revealed = True


def shared_batch(coord: Coordinator, checkers: int) -> tuple[BatchId, list[bytes]]:
    """A batch of this round that at least `checkers` verifiers must check, and who they are
    (runs rounds until one exists)."""
    now = 1000
    for _ in range(60):
        seed = coord.current_round().random_seed
        assignments = assign_data_for_state(coord)
        by_batch: dict[BatchId, list[bytes]] = {}
        round_ = coord.current_round()
        pool = round_verifiers(
            coord.epoch_state.clients,
            seed,
            coord.config.witness_nodes,
            coord.config.verification_percent,
            round_.tie_breaker_tasks,
        )
        for verifier in pool:
            for batch in verifier_sample(round_.sample_seed, verifier, list(assignments), pool):
                by_batch.setdefault(batch, []).append(verifier)
        for batch, who in sorted(by_batch.items()):
            if len(who) >= checkers and assignments[batch] not in who:
                return batch, who
        now = witness_round(coord, now + 1)
    raise AssertionError(f"no batch with {checkers} checkers in 60 rounds")
