"""`MetricsOptions`: the `--wandb-*`, `--metrics-local-port`, `--events-dir` and
`--keep-event-files` flags (`app.flags`), one section of `ClientOptions`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MetricsOptions:
    """Where the client's metrics go: a Weights & Biases run when `wandb_project` is set, a
    Prometheus port on localhost with `local_port`, event files under `events_dir`."""

    wandb_project: str | None = None
    wandb_run: str | None = None
    """The run's name (default: `{run_id}-{client short id}`)."""
    wandb_group: str | None = None
    wandb_entity: str | None = None
    local_port: int | None = None
    """`--metrics-local-port` (0: a free one; None: none)."""
    events_dir: Path | None = None
    """`--events-dir`: this client's event files go to `events_dir/<client id>/`."""
    keep_event_files: int = 5
    """`--keep-event-files`: the newest this many event files (one per epoch) are kept."""

    @property
    def wandb(self) -> bool:
        return self.wandb_project is not None

    def run_name(self, run_id: str, client: str) -> str:
        return self.wandb_run or f"{run_id}-{client}"
