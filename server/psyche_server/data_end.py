"""Ending a run cleanly when the data the server serves runs out.

The coordinator hands out data indices `data_index .. data_index + batch - 1` per round and
never wraps (neither does the reference, whose config has no field for it). When the server
runs the data server it knows how many samples there are, so before a round could read past
them it ends the run the coordinator's own way: `config.total_steps` is lowered to the step
of that round, the current round is the last one, the epoch cools down (checkpoints are
written) and the run is Finished, so clients exit with status 0 instead of logging
`OutOfRange` for every later round. The lowered `total_steps` is broadcast (clients that
predict the next round see it) and saved with the state; raise it again to resume the run
with more data. A run whose data cannot serve even its next epoch's first round is Finished
at once, from WaitingForMembers.

`data_end_step` is the pure rule; `DataEnd` applies it to a live coordinator and logs once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.types import RunState

log = logging.getLogger("psyche.server.data")


@dataclass(frozen=True)
class DataEndStep:
    """Where the data ends: the step whose round would read `[start, end]` (past the
    `held` samples), which becomes `config.total_steps`."""

    step: int
    start: int
    end: int
    held: int


def data_end_step(coordinator: Coordinator, held: int) -> DataEndStep | None:
    """The step whose round would be the first to read past `held` samples, when that step
    is the next round's (or, before an epoch, the first round's) and the run would still
    reach it; else None."""
    state = coordinator.run_state
    progress = coordinator.progress
    if state in (RunState.RoundTrain, RunState.RoundWitness):
        current = coordinator.current_round()
        index = current.data_index + coordinator.batch_size_at(current.data_index)
        step = progress.step + 1  # the next round's step (step grows at RoundWitness' end)
    elif state in (RunState.WaitingForMembers, RunState.Warmup):
        index = progress.epoch_start_data_index
        step = progress.step
    else:
        return None
    end = index + coordinator.batch_size_at(index) - 1
    if end < held or step >= coordinator.config.total_steps:
        return None
    return DataEndStep(step, index, end, held)


class DataEnd:
    """Applies `data_end_step` to the server's coordinator (see the module docstring)."""

    def __init__(self, held: int) -> None:
        self.held = held
        self.ended_at: DataEndStep | None = None

    def check(self, coordinator: Coordinator, now: float) -> bool:
        """Lower `total_steps` (and finish a waiting run) when the data ends; True if it
        changed the coordinator."""
        end = data_end_step(coordinator, self.held)
        if end is None:
            return False
        config = coordinator.config
        log.warning(
            "the training data runs out: the round of step %d would read samples [%d, %d] but "
            "the data server holds %d; the run ends before it (config.total_steps %d -> %d)",
            end.step,
            end.start,
            end.end,
            end.held,
            config.total_steps,
            end.step,
            extra={"step": end.step, "samples": end.held},
        )
        config.total_steps = end.step
        self.ended_at = end
        if coordinator.run_state == RunState.WaitingForMembers:
            coordinator.change_state(now, RunState.Finished)
        return True
