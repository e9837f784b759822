"""`[verification]` of a saved state.toml: the pydantic model of the convictions a server
keeps across restarts, validated at load like every other table (unknown keys are errors), so
`validate-config` and `run` refuse the same files.

Its TOML form: `convictions` and `bans` (proven convictions, absent in files saved before bans
were kept apart), each with `epoch`, `step`, `trainer` (hex), `batch` (`[start, end]`),
`verifiers` (hex), `agreement_milli` (0–1000) and `kind` (absent in files saved before kinds
existed: "verifiers"). `VerificationTable.to_toml()` gives that form back (what
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
MAX_BANS = 16_384
"""And at most this many bans (`psyche_common.coordinator.verdicts.MAX_BANS`)."""


class ConvictionTable(StrictModel):
    """One kept conviction."""

    epoch: U64
    step: U64
    trainer: ClientIdHex
    batch: Annotated[list[U64], Field(min_length=2, max_length=2)]
    """The batch's first and last sample index."""
    verifiers: list[ClientIdHex]
    agreement_milli: Annotated[int, Field(strict=True, ge=0, le=1000)]
    kind: Literal["verifiers", "false_accuser", "false_passer", "proven"] = "verifiers"


class VerificationTable(StrictModel):
    """`[verification]`: the convictions kept."""

    convictions: Annotated[list[ConvictionTable], Field(max_length=MAX_CONVICTIONS)]
    """The current epoch's (files from before `bans`: also proven ones of earlier epochs)."""
    bans: Annotated[list[ConvictionTable], Field(default_factory=list, max_length=MAX_BANS)]
    """The proven convictions that bar their keys from every later epoch (absent in files
    saved before bans were kept apart)."""

    def to_toml(self) -> dict[str, Any]:
        """The TOML table (ids as hex; no `bans` when there are none, as before they were
        kept apart)."""
        table = self.model_dump()
        if not table["bans"]:
            del table["bans"]
        return table
