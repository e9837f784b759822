"""`CoordinatorConfig`: the `[config]` table of state.toml (timings, client counts, batch sizes).

The reference's 14 fields are required, as in the reference (`per_client_shares`,
`max_share_multiple` and `join_mid_epoch` are ours and optional); each says what it means
below it. Integer widths follow the reference (u8/u16/u32/
u64); the cross-field rules live in `psyche_common.config.validation`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from psyche_common.config._types import U8, U16, U32, U64, MsSeconds, StrictModel


class CoordinatorConfig(StrictModel):
    """Run timings (seconds; `round_witness_time` may be fractional), client counts and batch
    sizes, in serialization order."""

    warmup_time: U64
    """Longest Warmup (clients load the model), in seconds; it ends early once enough
    witnesses report the model loaded. Less than `epoch_time` [WarmupTime]."""
    cooldown_time: U64
    """Length of the Cooldown that ends an epoch (checkpointing), in seconds; exact, no early
    exit. More than 0 [CooldownTime]."""
    max_round_train_time: U64
    """Longest RoundTrain, in seconds. More than 0, less than `epoch_time`
    [MaxRoundTrainTime]."""
    round_witness_time: MsSeconds
    """Length of RoundWitness, the witnesses' slack to send their proofs: whole seconds as in
    the reference, or fractional (whole milliseconds, ours). More than 0 [RoundWitnessTime]."""
    global_batch_size_warmup_tokens: U64
    """Tokens over which the global batch size grows linearly from `global_batch_size_start`
    to `global_batch_size_end`; 0: no ramp."""
    epoch_time: U64
    """Target epoch length in seconds, from the start of Warmup; once passed, two more rounds
    apply the pending results, then Cooldown. More than 0 [EpochTime]."""
    total_steps: U32
    """Steps 1 to `total_steps - 1` are trained; at `total_steps` the run cools down and is
    Finished. More than 0 [TotalSteps]."""
    init_min_clients: U16
    """Waiting clients needed to start an epoch. At least `min_clients`, at most 256
    [InitMinClients]."""
    min_clients: U16
    """Clients needed to keep an epoch going; with fewer it ends. More than 0 [MinClients]."""
    witness_nodes: U16
    """Witnesses per round; 0: every client (at most 32). At most `min_clients`
    [WitnessNodes]."""
    global_batch_size_start: U16
    """Samples per step at the start of the run. More than 0 [GlobalBatchSize]."""
    global_batch_size_end: U16
    """Samples per step after the ramp. At least `global_batch_size_start` [GlobalBatchSize]."""
    verification_percent: U8
    """Share of the round's non-tie-breaker clients that verify instead of training
    (`floor(clients * percent / 100)` verifiers; docs/verification.md). At most 100."""
    waiting_for_members_extra_time: U8
    """Least time spent in WaitingForMembers, in seconds, before an epoch may start. More
    than 0 [WaitingForMembersExtraTime]."""

    per_client_shares: bool = False
    """Ours, optional: give each trainer a share of the round's batch proportional to its
    witnessed throughput (`psyche_common.coordinator.shares`); false: equal shares, as the
    reference."""
    max_share_multiple: U8 = Field(default=4, ge=1)
    """Ours, optional, with `per_client_shares`: no trainer's share exceeds this multiple of
    the mean share (the round's batch over its trainers)."""

    join_mid_epoch: bool = False
    """Ours, optional: admit clients that join during an epoch at the next round start; each
    fetches the members' snapshot of the weights, proves it holds them (its weights hash
    matches the members' majority) and is seated at a later round start
    (`psyche_common.coordinator.joining`); false: joiners wait for the next epoch, as the
    reference."""

    def to_toml(self) -> dict[str, Any]:
        """The TOML table; the optional fields of ours only when set, so a state without them
        saves and broadcasts as before."""
        return self.model_dump(exclude_defaults=False, exclude=_unset_optional(self))


OPTIONAL_FIELDS = ("per_client_shares", "max_share_multiple", "join_mid_epoch")
"""Fields of ours with a default: written only when they differ from it."""


def _unset_optional(config: CoordinatorConfig) -> set[str]:
    return {
        name
        for name in OPTIONAL_FIELDS
        if getattr(config, name) == CoordinatorConfig.model_fields[name].default
    }
