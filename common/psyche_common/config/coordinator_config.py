"""`CoordinatorConfig`: the `[config]` table of state.toml (timings, client counts, batch sizes).

All 14 fields are required, as in the reference. Integer widths follow the reference (u8/u16/u32/
u64); the cross-field rules live in `psyche_common.config.validation`.
"""

from __future__ import annotations

from typing import Any

from psyche_common.config._types import U8, U16, U32, U64, MsSeconds, StrictModel


class CoordinatorConfig(StrictModel):
    """Run timings (seconds; `round_witness_time` may be fractional), client counts and batch
    sizes, in serialization order."""

    warmup_time: U64
    cooldown_time: U64
    max_round_train_time: U64
    round_witness_time: MsSeconds
    """Whole seconds as in the reference, or fractional (whole milliseconds, ours)."""
    global_batch_size_warmup_tokens: U64
    epoch_time: U64
    total_steps: U32
    init_min_clients: U16
    min_clients: U16
    witness_nodes: U16
    global_batch_size_start: U16
    global_batch_size_end: U16
    verification_percent: U8
    waiting_for_members_extra_time: U8

    def to_toml(self) -> dict[str, Any]:
        return self.model_dump()
