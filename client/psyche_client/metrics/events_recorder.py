"""`ClientEvents`: this client's event files (`--events-dir`), written through
`psyche_common.events.files.EventFileWriter` under `DIR/<client id hex>/`.

What is recorded, one line each:
- `state_changed`: the coordinator's run state, epoch or step changed (`observe`, called with
  each new coordinator state); a new epoch starts a new file.
- `step`: a finished step's figures (loss, lr, tokens/s, P2P bytes, how long it lasted), as
  the metrics sink of `reporter.StepReporter` (`log`).
- `log`: every warning and error the client logs, and the info lines that mark a milestone
  (`MILESTONES`: the model ready or fetched, a weights check, a checkpoint saved, uploaded or
  deleted), through a logging handler installed while the recorder is open.
- `stopped` when the client closes it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from psyche_common.coordinator import Coordinator
from psyche_common.events.files import EventFileWriter

MILESTONES = frozenset(
    {
        "model ready",
        "model fetched peer-to-peer",
        "weights check: %s",
        "checkpoint saved to %s",
        "checkpoint uploaded to %s@%s",
        "deleted the old checkpoint %s (--keep-steps %s)",
    }
)
"""The format strings of the info records recorded (warnings and errors always are)."""


class _EventLogHandler(logging.Handler):
    def __init__(self, writer: EventFileWriter) -> None:
        super().__init__(logging.INFO)
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("psyche.events"):
            return  # the writer's own failures: never back into the writer
        if record.levelno < logging.WARNING and record.msg not in MILESTONES:
            return
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            message = str(record.msg)
        self.writer.write("log", {"level": record.levelname, "logger": record.name, "msg": message})


class ClientEvents:
    def __init__(self, writer: EventFileWriter) -> None:
        self.writer = writer
        self.handler = _EventLogHandler(writer)
        logging.getLogger().addHandler(self.handler)
        self._state: tuple[str, int, int] | None = None

    def observe(self, coordinator: Coordinator) -> None:
        state = (
            coordinator.run_state.name,
            coordinator.progress.epoch,
            coordinator.progress.step,
        )
        if state == self._state:
            return
        old = self._state
        self._state = state
        self.writer.start_epoch(state[1])
        self.writer.write(
            "state_changed",
            {
                "old_state": None if old is None else old[0],
                "new_state": state[0],
                "epoch": state[1],
                "step": state[2],
                "clients": len(coordinator.epoch_state.clients),
            },
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """A finished step's figures (or extras such as eval scores)."""
        self.writer.write("step", {"step": step, "figures": dict(values)})

    def close(self) -> None:
        """Write `stopped` and close the file (once; later calls do nothing)."""
        if self.handler not in logging.getLogger().handlers:
            return
        logging.getLogger().removeHandler(self.handler)
        self.writer.write("stopped", {"dropped_events": self.writer.dropped})
        self.writer.close()
