"""`CoordinatorEvents`: the server's event file (`--events-dir`), one `coordinator` record per
change of what the coordinator is (run state, epoch, step, its clients and their states).

`observe(coordinator)` is called after every tick and message-driven change; it writes only
when that changed, and starts a new file at each new epoch (`psyche_common.events.files`).
"""

from __future__ import annotations

from psyche_common.client_id import short_id
from psyche_common.coordinator import Coordinator
from psyche_common.events.files import COORDINATOR_SOURCE, EventFileWriter

from .events_options import EventsOptions

SERVER_VERSION = "psyche-py-server/0.1"

_Key = tuple[str, int, int, tuple[tuple[bytes, str], ...]]


class CoordinatorEvents:
    def __init__(self, writer: EventFileWriter) -> None:
        self.writer = writer
        self._last: _Key | None = None

    @classmethod
    def open(cls, options: EventsOptions, coordinator: Coordinator) -> CoordinatorEvents | None:
        """The recorder `options` ask for (None without `--events-dir`); raises
        `EventFileError` when its directory cannot be written."""
        if options.dir is None:
            return None
        writer = EventFileWriter(
            options.dir,
            COORDINATOR_SOURCE,
            {"run_id": coordinator.run_id, "version": SERVER_VERSION},
            keep_files=options.keep_files,
            epoch=coordinator.progress.epoch,
        )
        return cls(writer)

    def observe(self, coordinator: Coordinator) -> None:
        clients = tuple((c.id, c.state.name) for c in coordinator.epoch_state.clients)
        key = (
            coordinator.run_state.name,
            coordinator.progress.epoch,
            coordinator.progress.step,
            clients,
        )
        if key == self._last:
            return
        self._last = key
        self.writer.start_epoch(coordinator.progress.epoch)
        self.writer.write(
            "coordinator",
            {
                "run_state": key[0],
                "epoch": key[1],
                "step": key[2],
                "clients": [[short_id(client), state] for client, state in clients],
                "min_clients": coordinator.config.min_clients,
                "checkpoint": type(coordinator.model.checkpoint).__name__,
            },
        )

    def close(self) -> None:
        self.writer.close()
