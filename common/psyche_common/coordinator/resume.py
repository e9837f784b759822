"""Where a restarted server resumes the run: the coordinator worth saving at any moment (pure).

`resume_point(coord)` is a copy of `coord` as a server started from it should see it: waiting
for members (or Finished) at the progress the clients' weights hold, with the members that
hold those weights kept as the previous epoch's clients (so a P2P checkpoint stays P2P when one
of them joins again) and nothing tied to live connections. What the live state means:

- RoundTrain or RoundWitness of a round of height h: every client has applied the rounds
  before h−1; rounds h−1 and h are in flight and are dropped. The step stays where it is (it
  never goes back), the data cursor goes back to the first sample of round h−1 (of round 0
  when h < 1), so the dropped rounds' data is trained again, and the epoch number stays: the
  next epoch continues the interrupted one's count. Once the epoch has applied a round (h ≥ 2)
  the members hold weights no Hub repo has, so the checkpoint becomes P2P.
- Cooldown: the weights hold every result of the epoch; the epoch is finished as the end of
  the Cooldown would finish it (`transitions.finish_epoch`).
- WaitingForMembers, Paused, Finished: the state as it is.
- Warmup: `None`. Nothing a restart needs has changed since WaitingForMembers, and the
  previous epoch's members (whom the P2P check needs) are no longer in the state, so the point
  saved before Warmup stays the one to resume from.
"""

from __future__ import annotations

from typing import TypeVar

from psyche_common.coordinator import checkpoints, transitions, wire
from psyche_common.coordinator.state import CoordinatorState
from psyche_common.coordinator.types import NUM_STORED_ROUNDS, RunState

ROUND_STATES = frozenset({RunState.RoundTrain, RunState.RoundWitness})
APPLIED_FROM_HEIGHT = 2
"""The first round height at which clients have applied a round of the epoch (h − 2)."""

_State = TypeVar("_State", bound=CoordinatorState)
"""The state's class: a resume point of a `Coordinator` is a `Coordinator`."""


def has_resume_point(coord: CoordinatorState) -> bool:
    """False in Warmup, where the point saved before it is still the one (cheap: no copy)."""
    return coord.run_state != RunState.Warmup


def resume_point(coord: _State) -> _State | None:
    """The coordinator a restarted server should load, or None in Warmup (keep the last one)."""
    if not has_resume_point(coord):
        return None
    point = coord.copy()
    if point.run_state in ROUND_STATES:
        drop_rounds_in_flight(point)
    elif point.run_state == RunState.Cooldown:
        transitions.finish_epoch(point)
    wire.reset_ephemeral(point)
    return point


def drop_rounds_in_flight(coord: CoordinatorState) -> None:
    """Move the data cursor back to the first round whose results nobody applied (see the
    module docstring) and name the P2P checkpoint when the members hold trained weights."""
    es = coord.epoch_state
    height = coord.current_round().height
    first_unapplied = es.rounds[(es.rounds_head - 1) % NUM_STORED_ROUNDS] if height >= 1 else None
    cursor_round = first_unapplied or coord.current_round()
    coord.progress.epoch_start_data_index = cursor_round.data_index
    if height >= APPLIED_FROM_HEIGHT:
        coord.model.checkpoint = checkpoints.after_cooldown(coord.model.checkpoint)
