"""The `EventsOptions` section of `ServerOptions`: where `psyche-server run` records the
run's coordinator states (`--events-dir`, `--keep-event-files`, in `flags.RUN_FLAGS`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_KEEP_EVENT_FILES = 5


@dataclass(frozen=True)
class EventsOptions:
    """Where the server records the run's coordinator states (None: nowhere)."""

    dir: Path | None = None
    """`--events-dir`: records go to `dir/coordinator/events-epoch-*.jsonl`."""
    keep_files: int = DEFAULT_KEEP_EVENT_FILES
    """`--keep-event-files`: the newest this many files (one per epoch) are kept."""
