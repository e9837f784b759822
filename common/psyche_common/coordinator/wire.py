"""Serialization of the coordinator: the msgpack-safe broadcast form (`to_wire` /
`fields_from_wire`) and the state.toml form (`to_state_file` / `fields_from_state_file`), plus
`reset_ephemeral`. The decoders return the constructor's fields (`CoordinatorFields`);
`Coordinator.from_wire` and `Coordinator.from_state_file` build the object from them.

Wire form: only dict/list/int/float/str/bytes/bool; client ids, bloom bits and Merkle roots
stay bytes; the model and config use their TOML shapes. The TOML form of `epoch_state` writes
bytes as hex strings and the full-range u64s (round seeds, bloom keys) as decimal strings,
because TOML integers are signed 64-bit.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pydantic import ValidationError

from psyche_common.config import (
    CoordinatorConfig,
    EpochStateTable,
    LLMConfig,
    StateFile,
    StateFileProgress,
    VerificationTable,
)
from psyche_common.coordinator.state import CoordinatorState
from psyche_common.coordinator.types import ClientState, EpochState, Progress, RunState
from psyche_common.coordinator.verdicts import VerificationRecord
from psyche_common.wire_checks import wire_map, wire_uint


class CoordinatorFields(TypedDict):
    """A decoded coordinator: the fields `Coordinator(...)` takes."""

    run_id: str
    run_state: RunState
    model: LLMConfig
    config: CoordinatorConfig
    progress: Progress
    epoch_state: EpochState
    run_state_start_ms: int
    pending_pause: bool
    verification: VerificationRecord


WIRE_KEYS = (
    "run_id",
    "run_state",
    "model",
    "config",
    "progress",
    "epoch_state",
    "run_state_start_ms",
    "pending_pause",
)


def to_wire(coord: CoordinatorState) -> dict[str, Any]:
    return {
        "run_id": coord.run_id,
        "run_state": int(coord.run_state),
        "model": coord.model.to_toml(),
        "config": coord.config.to_toml(),
        "progress": coord.progress.to_wire(),
        "epoch_state": coord.epoch_state.to_wire(),
        "run_state_start_ms": coord.run_state_start_ms,
        "pending_pause": coord.pending_pause,
        "verification": coord.verification.to_wire(),
    }


def fields_from_wire(data: Any) -> CoordinatorFields:
    """Decode `to_wire` output; raises ValueError naming the first bad field."""
    data = wire_map(data, "coordinator")
    missing = [key for key in WIRE_KEYS if key not in data]
    if missing:
        raise ValueError(f"coordinator is missing {', '.join(missing)}")
    run_id = data["run_id"]
    if not isinstance(run_id, str):
        raise ValueError("coordinator.run_id must be a string")
    run_state = data["run_state"]
    if run_state not in RunState._value2member_map_ or isinstance(run_state, bool):
        raise ValueError(f"coordinator.run_state {run_state!r} is unknown")
    if not isinstance(data["pending_pause"], bool):
        raise ValueError("coordinator.pending_pause must be a bool")
    try:
        model = LLMConfig.model_validate(data["model"])
        config = CoordinatorConfig.model_validate(data["config"])
    except ValidationError as exc:
        raise ValueError(f"coordinator model/config: {exc}") from exc
    return CoordinatorFields(
        run_id=run_id,
        run_state=RunState(run_state),
        model=model,
        config=config,
        progress=Progress.from_wire(data["progress"]),
        epoch_state=EpochState.from_wire(data["epoch_state"]),
        run_state_start_ms=wire_uint(data, "run_state_start_ms", "coordinator"),
        pending_pause=data["pending_pause"],
        # optional: coordinators from before verification existed have none
        verification=VerificationRecord.from_wire(data.get("verification")),
    )


def reset_ephemeral(coord: CoordinatorState) -> None:
    """Forget everything tied to live connections, as the server does at startup.

    The run waits for members again (a run whose step already reached `total_steps` starts as
    Finished). The Healthy clients stay in `epoch_state.clients` as the previous epoch's
    members: they hold the model, so when one of them joins again the next epoch keeps a P2P
    checkpoint, and only an epoch none of them is back for falls back to the Hub. Exited
    clients are dropped. (The reference overwrites every stored client with a zero id, which
    always forces the Hub fallback after a restart; see docs/deviations.md.)
    """
    if coord.progress.step >= coord.config.total_steps:
        coord.run_state = RunState.Finished
    else:
        coord.run_state = RunState.WaitingForMembers
    es = coord.epoch_state
    es.clients = [client for client in es.clients if client.state == ClientState.Healthy]
    es.exited_clients = []
    es.joining = []  # joiners were seated by no round: they are pending again once back
    coord.verification.new_epoch(coord.progress.epoch)  # this epoch's convictions stay


# ----- state.toml -----


def fields_from_state_file(state_file: StateFile) -> CoordinatorFields:
    """A coordinator from a loaded state.toml; raises ValueError for a bad `epoch_state`."""
    epoch_state = (
        EpochState()
        if state_file.epoch_state is None
        else epoch_state_from_toml(state_file.epoch_state.to_toml())
    )
    progress = state_file.progress
    return CoordinatorFields(
        run_id=state_file.run_id,
        run_state=state_file.run_state,
        model=state_file.model.model_copy(deep=True),
        config=state_file.config.model_copy(deep=True),
        progress=Progress(progress.epoch, progress.step, progress.epoch_start_data_index),
        epoch_state=epoch_state,
        run_state_start_ms=state_file.run_state_start_unix_timestamp * 1000,
        pending_pause=state_file.pending_pause,
        verification=VerificationRecord.from_toml(
            None if state_file.verification is None else state_file.verification.to_toml()
        ),
    )


def to_state_file(coord: CoordinatorState) -> StateFile:
    return StateFile(
        run_id=coord.run_id,
        run_state=coord.run_state,
        model=coord.model.model_copy(deep=True),
        config=coord.config.model_copy(deep=True),
        progress=StateFileProgress(
            epoch=coord.progress.epoch,
            step=coord.progress.step,
            epoch_start_data_index=coord.progress.epoch_start_data_index,
        ),
        epoch_state=EpochStateTable.model_validate(epoch_state_to_toml(coord.epoch_state)),
        run_state_start_unix_timestamp=coord.run_state_start_unix_timestamp,
        pending_pause=coord.pending_pause,
        verification=VerificationTable.model_validate(coord.verification.to_toml())
        if coord.verification.convictions or coord.verification.bans
        else None,
    )


def _bloom_to_toml(bloom: dict[str, Any]) -> dict[str, Any]:
    return {"keys": [str(k) for k in bloom["keys"]], "bits": bloom["bits"].hex()}


def _bloom_from_toml(bloom: Any) -> dict[str, Any]:
    bloom = wire_map(bloom, "bloom")
    return {
        "keys": [int(k) for k in bloom.get("keys", [])],
        "bits": bytes.fromhex(bloom.get("bits", "")),
    }


def _client_to_toml(client: list[Any]) -> dict[str, Any]:
    client_id, state, exited_height = client[:3]
    table = {
        "id": client_id.hex(),
        "state": ClientState(state).name,
        "exited_height": exited_height,
    }
    if len(client) == 5:  # per-client shares: the rate (a u64, as a string) and misses
        table["rate"], table["misses"] = str(client[3]), client[4]
    return table


def _client_from_toml(client: Any) -> list[Any]:
    client = wire_map(client, "client")
    state = client.get("state")
    if state not in ClientState.__members__:
        raise ValueError(f"client state {state!r} is unknown")
    wire = [
        bytes.fromhex(client.get("id", "")),
        int(ClientState[state]),
        client.get("exited_height"),
    ]
    if "rate" in client or "misses" in client:
        wire += [int(client.get("rate", "0")), client.get("misses", 0)]
    return wire


def epoch_state_to_toml(epoch_state: EpochState) -> dict[str, Any]:
    """`epoch_state` as a TOML table (bytes as hex, u64 seeds and keys as decimal strings)."""
    document = epoch_state.to_wire()
    for round_ in document["rounds"]:
        round_["random_seed"] = str(round_["random_seed"])
        round_["next_random_seed"] = str(round_["next_random_seed"])
        # a round's verifier-sample seed is live state: a restarted server drops the rounds
        # in flight (`resume`), so the file holds its commitment only, never the seed
        round_.pop("sample_seed", None)
        if "sample_commit" in round_:
            round_["sample_commit"] = round_["sample_commit"].hex()
        for witness in round_["witnesses"]:
            witness["participant_bloom"] = _bloom_to_toml(witness["participant_bloom"])
            witness["broadcast_bloom"] = _bloom_to_toml(witness["broadcast_bloom"])
            witness["broadcast_merkle"] = witness["broadcast_merkle"].hex()
    document["clients"] = [_client_to_toml(c) for c in document["clients"]]
    document["exited_clients"] = [_client_to_toml(c) for c in document["exited_clients"]]
    # joiners are live state, like the rounds in flight: a restarted server has none
    document.pop("joining", None)
    return document


def epoch_state_from_toml(table: dict[str, Any]) -> EpochState:
    """Parse `epoch_state_to_toml` output; raises ValueError saying what is wrong."""
    try:
        document = {**wire_map(table, "epoch_state")}
        rounds = []
        for round_ in document.get("rounds", []):
            round_ = {**wire_map(round_, "round")}
            round_["random_seed"] = int(round_.get("random_seed", "0"))
            # states saved before the next-round seed existed have none: 0 like a fresh round
            round_["next_random_seed"] = int(round_.get("next_random_seed", "0"))
            if "sample_commit" in round_:  # absent from states saved before the hidden sample
                round_["sample_commit"] = bytes.fromhex(str(round_["sample_commit"]))
            witnesses = []
            for witness in round_.get("witnesses", []):
                witness = {**wire_map(witness, "witness")}
                witness["participant_bloom"] = _bloom_from_toml(witness.get("participant_bloom"))
                witness["broadcast_bloom"] = _bloom_from_toml(witness.get("broadcast_bloom"))
                witness["broadcast_merkle"] = bytes.fromhex(witness.get("broadcast_merkle", ""))
                witnesses.append(witness)
            round_["witnesses"] = witnesses
            rounds.append(round_)
        document["rounds"] = rounds
        document["clients"] = [_client_from_toml(c) for c in document.get("clients", [])]
        document["exited_clients"] = [
            _client_from_toml(c) for c in document.get("exited_clients", [])
        ]
        return EpochState.from_wire(document)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"state file epoch_state is not valid: {exc}") from exc
