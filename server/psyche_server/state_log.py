"""The server's log of the run's state: one line for every change of run state or epoch,
whether a tick made it (a timeout, enough members) or a client message did (the last warmup
witness, a witness quorum, a health check that drops the epoch below `min_clients`).

`RunStateLog` remembers the last (state, epoch) it logged; the app asks it to `note` the
coordinator after every tick and after every client message it applied, naming the cause.
"""

from __future__ import annotations

import logging

from psyche_common.coordinator import Coordinator
from psyche_common.run_state import RunState

log = logging.getLogger("psyche.server")


class RunStateLog:
    """Logs `run state OLD -> NEW (epoch E, step S)` once per change, with its cause."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._last: tuple[RunState, int] = self._now()

    def _now(self) -> tuple[RunState, int]:
        return self._coordinator.run_state, int(self._coordinator.progress.epoch)

    def note(self, cause: str) -> None:
        """Log the change since the last call, if any; `cause`: what made it (`tick`, or the
        message and its sender)."""
        now = self._now()
        if now == self._last:
            return
        before, self._last = self._last, now
        step = self._coordinator.progress.step
        log.info(
            "run state %s -> %s (epoch %d, step %d)",
            before[0].name,
            now[0].name,
            now[1],
            step,
            extra={
                "old_state": before[0].name,
                "new_state": now[0].name,
                "epoch": now[1],
                "step": step,
                "cause": cause,
            },
        )
