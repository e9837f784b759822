"""`StateFile`: a whole state.toml (a serialized coordinator) and its TOML round trip."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, PlainSerializer, PlainValidator, field_validator
from pydantic_core import PydanticCustomError

from psyche_common.config._types import U16, U32, U64, RunIdStr, StrictModel
from psyche_common.config.coordinator_config import CoordinatorConfig
from psyche_common.config.epoch_state import EpochStateTable
from psyche_common.config.model import LLMConfig
from psyche_common.config.verification_table import VerificationTable
from psyche_common.run_state import RunState

_RUN_STATE_NAMES = [repr(state.name) for state in RunState]
_EXPECTED_RUN_STATES = f"{', '.join(_RUN_STATE_NAMES[:-1])} or {_RUN_STATE_NAMES[-1]}"


def _run_state_from_name(value: Any) -> RunState:
    """A `RunState` member, or its name as state.toml writes it (`"WaitingForMembers"`)."""
    if isinstance(value, RunState):
        return value
    if isinstance(value, str) and value in RunState.__members__:
        return RunState[value]
    raise PydanticCustomError(
        "enum", "Input should be {expected}", {"expected": _EXPECTED_RUN_STATES}
    )


def _run_state_name(state: RunState) -> str:
    return state.name


RunStateName = Annotated[
    RunState, PlainValidator(_run_state_from_name), PlainSerializer(_run_state_name)
]
"""A `RunState` field read from and written as the member's name (the TOML form)."""


class StateFileProgress(StrictModel):
    """`[progress]`: where the run is; persists across epochs (the coordinator's own form is
    `psyche_common.coordinator.Progress`)."""

    epoch: U16 = 0
    """Epochs completed."""
    step: U32 = 1
    """The next training step (steps count from 1)."""
    epoch_start_data_index: U64 = 0
    """The global sample index at which the current epoch's data starts."""


class StateFile(StrictModel):
    """Everything in state.toml. `model` holds the `[model.LLM]` table (the only model kind).

    `epoch_state` and `verification` are validated like every other table (`EpochStateTable`,
    `VerificationTable`); `psyche_common.coordinator` builds its own types from them.
    """

    run_id: RunIdStr
    """The run's name, which joining clients must send; not empty."""
    run_state: RunStateName = RunState.WaitingForMembers
    """The state when the file was saved; the server always starts in WaitingForMembers."""
    model: LLMConfig
    """`[model.LLM]`: what is trained, on which data, with which optimizer."""
    config: CoordinatorConfig
    """`[config]`: timings, client counts and batch sizes."""
    progress: StateFileProgress = Field(default_factory=StateFileProgress)
    """`[progress]`: where the run is."""
    epoch_state: EpochStateTable | None = None
    run_state_start_unix_timestamp: U64 = 0
    """Unix second at which `run_state` was entered (written in saved states)."""
    pending_pause: bool = False
    """A pause asked for during an epoch, applied at its end (written in saved states)."""
    verification: VerificationTable | None = None
    """The kept convictions (`psyche_common.coordinator.VerificationRecord`'s TOML table);
    absent in files saved before verification existed or without any conviction."""

    @field_validator("model", mode="before")
    @classmethod
    def _unwrap_llm(cls, value: Any) -> Any:
        if isinstance(value, LLMConfig):
            return value
        if not isinstance(value, dict) or set(value) != {"LLM"}:
            found = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise PydanticCustomError(
                "model_not_llm",
                "must be a single [model.LLM] table (the only model kind); found {found}",
                {"found": found},
            )
        return value["LLM"]

    @field_validator("pending_pause", mode="before")
    @classmethod
    def _pending_pause_as_bool(cls, value: Any) -> Any:
        # The reference stores it as a one-byte boolean; accept 0/1 as well as true/false.
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise PydanticCustomError("bool_type", "must be true or false (or 0 / 1)")

    def to_toml_dict(self) -> dict[str, Any]:
        """The TOML document (for tomli_w) that `load_state` reads back into an equal object."""
        document: dict[str, Any] = {
            "run_id": self.run_id,
            "run_state": self.run_state.name,
            "run_state_start_unix_timestamp": self.run_state_start_unix_timestamp,
            "pending_pause": self.pending_pause,
            "config": self.config.to_toml(),
            "model": {"LLM": self.model.to_toml()},
            "progress": self.progress.model_dump(),
        }
        if self.epoch_state is not None:
            document["epoch_state"] = self.epoch_state.to_toml()
        if self.verification is not None:
            document["verification"] = self.verification.to_toml()
        return document
