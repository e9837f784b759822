"""`LLMConfig`: the `[model.LLM]` table of state.toml (what is trained and how)."""

from __future__ import annotations

from typing import Any

from psyche_common.config._types import U32, StrictModel
from psyche_common.config.checkpoint import Checkpoint
from psyche_common.config.data_location import DataLocation
from psyche_common.config.enums import Architecture, DataType
from psyche_common.config.lr_schedule import LRSchedule
from psyche_common.config.optimizer import Optimizer


class LLMConfig(StrictModel):
    """The model being trained. Fields in the reference's serialization order."""

    max_seq_len: U32
    """Tokens per training sample (tokens seen = data index x max_seq_len). More than 0;
    equal to data.toml's `seq_len` when both are given."""
    cold_start_warmup_steps: U32
    """Steps over which the learning rate warms up again in the first epoch after a pause
    (the cold-start factor); 0: off. At most the rounds that fit in an epoch."""
    architecture: Architecture
    """The model family, checked against the `model_type` of the model's `config.json`."""
    checkpoint: Checkpoint
    """Where the initial weights come from (not Ephemeral)."""
    data_type: DataType
    """The kind of training data (Pretraining or Finetuning)."""
    data_location: DataLocation
    """Where the clients read their samples."""
    lr_schedule: LRSchedule
    """The learning rate of each step."""
    optimizer: Optimizer
    """How updates are computed and shared."""

    def to_toml(self) -> dict[str, Any]:
        """The `[model.LLM]` table as written to TOML."""
        return {
            "max_seq_len": self.max_seq_len,
            "cold_start_warmup_steps": self.cold_start_warmup_steps,
            "architecture": self.architecture.value,
            "checkpoint": self.checkpoint.to_toml(),
            "data_type": self.data_type.value,
            "data_location": self.data_location.to_toml(),
            "lr_schedule": self.lr_schedule.to_toml(),
            "optimizer": self.optimizer.to_toml(),
        }
