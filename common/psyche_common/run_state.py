"""`RunState`: the coordinator's run state, shared by the state machine and the state file.

One enum for both forms: the wire (and the reference's numbering) uses the integer value, the
state.toml `run_state` key the member name (`"WaitingForMembers"`). It lives outside
`psyche_common.coordinator` and `psyche_common.config` so that both can import it without
importing each other.
"""

from __future__ import annotations

import enum


class RunState(enum.IntEnum):
    """The run's state machine (the reference's numbering)."""

    Uninitialized = 0
    WaitingForMembers = 1
    Warmup = 2
    RoundTrain = 3
    RoundWitness = 4
    Cooldown = 5
    Finished = 6
    Paused = 7

    @property
    def text(self) -> str:
        """The reference's display text ("Waiting for members", "Training", ...)."""
        return _RUN_STATE_TEXT[self]

    def __str__(self) -> str:
        return self.name


_RUN_STATE_TEXT = {
    RunState.Uninitialized: "Uninitialized",
    RunState.WaitingForMembers: "Waiting for members",
    RunState.Warmup: "Warmup",
    RunState.RoundTrain: "Training",
    RunState.RoundWitness: "Witness",
    RunState.Cooldown: "Cooldown",
    RunState.Finished: "Finished",
    RunState.Paused: "Paused",
}
