"""Plain (unit-only) enums of the configuration, written in TOML as their variant name.

The run state of a state file is `psyche_common.run_state.RunState`, shared with the coordinator.
"""

from __future__ import annotations

from enum import StrEnum


class Architecture(StrEnum):
    """Model architecture family (`model.LLM.architecture`)."""

    HF_LLAMA = "HfLlama"
    HF_DEEPSEEK = "HfDeepseek"
    HF_AUTO = "HfAuto"
    TORCHTITAN = "Torchtitan"


class DataType(StrEnum):
    """Kind of training data (`model.LLM.data_type`)."""

    PRETRAINING = "Pretraining"
    FINETUNING = "Finetuning"


class TokenSize(StrEnum):
    """Bytes per token in raw token files: u16 or u32, little-endian."""

    TWO_BYTES = "TwoBytes"
    FOUR_BYTES = "FourBytes"

    @property
    def num_bytes(self) -> int:
        return 2 if self is TokenSize.TWO_BYTES else 4

    @classmethod
    def from_num_bytes(cls, num_bytes: int) -> TokenSize:
        if num_bytes == 2:
            return cls.TWO_BYTES
        if num_bytes == 4:
            return cls.FOUR_BYTES
        raise ValueError(f"Unsupported token bytes length: {num_bytes} (expected 2 or 4)")
