"""`--events-dir` and `--keep-event-files` of `psyche-server run`, in one place: the
`EventsOptions` they set (a section of `ServerOptions`) and the click options, added to `run`
by one decorator (`events_flags`) and read back by `events_from_flags`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])

DEFAULT_KEEP_EVENT_FILES = 5


@dataclass(frozen=True)
class EventsOptions:
    """Where the server records the run's coordinator states (None: nowhere)."""

    dir: Path | None = None
    """`--events-dir`: records go to `dir/coordinator/events-epoch-*.jsonl`."""
    keep_files: int = DEFAULT_KEEP_EVENT_FILES
    """`--keep-event-files`: the newest this many files (one per epoch) are kept."""


def events_flags(command: F) -> F:
    """Add `--events-dir` and `--keep-event-files` to `command`."""
    command = click.option(
        "--keep-event-files",
        type=click.IntRange(1),
        default=DEFAULT_KEEP_EVENT_FILES,
        show_default=True,
        help="event files (one per epoch) kept in --events-dir; older ones are deleted",
    )(command)
    return click.option(
        "--events-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="record every change of the coordinator (state, epoch, step, members) in "
        "DIR/coordinator/events-epoch-*.jsonl, clients' own events may go to the same DIR "
        "(`train --events-dir`); read them with `psyche-server observe --events-dir DIR`",
    )(command)


def events_from_flags(events_dir: Path | None, keep_event_files: int) -> EventsOptions:
    return EventsOptions(events_dir, keep_event_files)
