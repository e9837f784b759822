"""`[verification]` of a saved state.toml: the pydantic model of the convictions a server
keeps across restarts, validated at load like every other table (unknown keys are errors), so
`validate-config` and `run` refuse the same files.

Its TOML form: `convictions`, each with `epoch`, `step`, `trainer` (hex), `batch` (`[start,
end]`), `verifiers` (hex), `agreement_milli` (0–1000) and `kind` (absent in files saved before
kinds existed: "verifiers"). `VerificationTable.to_toml()` gives that form back (what
`psyche_common.coordinator.verdicts.VerificationRecord.from_toml` reads).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from psyche_common.config._types import U64, StrictModel
from psyche_common.config.epoch_state import ClientIdHex

MAX_CONVICTIONS = 256
"""The coordinator's record keeps at most this many
(`psyche_common.coordinator.verdicts.MAX_CONVICTIONS`)."""


class ConvictionTable(StrictModel):
    """One kept conviction."""

    epoch: U64
    step: U64
    trainer: ClientIdHex
    batch: Annotated[list[U64], Field(min_length=2, max_length=2)]
    """The batch's first and last sample index."""
    verifiers: list[ClientIdHex]
    agreement_milli: Annotated[int, Field(strict=True, ge=0, le=1000)]
    kind: Literal["verifiers", "false_accuser", "proven"] = "verifiers"


class VerificationTable(StrictModel):
    """`[verification]`: the convictions kept."""

    convictions: Annotated[list[ConvictionTable], Field(max_length=MAX_CONVICTIONS)]

    def to_toml(self) -> dict[str, Any]:
        """The TOML table (ids as hex)."""
        return self.model_dump()
