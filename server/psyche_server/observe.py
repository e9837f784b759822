"""`psyche-server observe`: a run's history after the fact, read from its event files.

Reads every source under `--events-dir` (the server's `coordinator` records and each client's
own events, `psyche_common.events`), prints one summary line per source and then the merged
timeline, oldest first. Read-only: it never writes to the directory.
"""

from __future__ import annotations

from pathlib import Path

import click
from psyche_common.events.render import render_summary, render_timeline
from psyche_common.events.timeline import EventsDirError, read_timeline


@click.command("observe")
@click.option(
    "--events-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="the directory given as --events-dir to `psyche-server run` and `psyche-client "
    "train` (one subdirectory per source: coordinator, and each client's id)",
)
@click.option(
    "--source",
    "sources",
    multiple=True,
    metavar="NAME",
    help="only this source's events: `coordinator` or a client's id (its first 8 hex "
    "characters are enough); repeat for several (default: all)",
)
@click.option(
    "--last",
    type=click.IntRange(1),
    default=None,
    help="print only the last N events of the timeline (default: all)",
)
def observe(events_dir: Path, sources: tuple[str, ...], last: int | None) -> None:
    """Print a run's history from its event files: a summary per source, then every event
    in time order."""
    try:
        timeline = read_timeline(events_dir)
    except EventsDirError as exc:
        raise click.ClickException(str(exc)) from None
    chosen = [
        name
        for name in timeline.sources
        if not sources or any(name == wanted or name.startswith(wanted) for wanted in sources)
    ]
    if sources and not chosen:
        known = ", ".join(timeline.sources) or "none"
        raise click.ClickException(
            f"--source {', '.join(sources)}: no such source in {events_dir} (found: {known})"
        )
    if not timeline.sources:
        raise click.ClickException(
            f"{events_dir} holds no event files (a directory given as --events-dir to "
            "`psyche-server run` or `psyche-client train` has one subdirectory per source)"
        )
    for line in render_summary({name: timeline.sources[name] for name in chosen}):
        click.echo(line)
    entries = [entry for entry in timeline.entries if entry.source in chosen]
    if last is not None:
        entries = entries[-last:]
    click.echo("")
    for line in render_timeline(entries):
        click.echo(line)
