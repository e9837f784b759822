"""Reading event files back: every source's files under an events directory, merged into one
timeline in time order (`read_timeline`), with what each source left (`SourceSummary`).

A line that is not a JSON object with a numeric `ts` and a string `kind` (a line cut off by a
crash, a stray file's text) is skipped and counted, never fatal. Only `*.jsonl` files in the
directory's immediate subdirectories are read; the subdirectory names the source.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psyche_common.events.files import FILE_SUFFIX


class EventsDirError(OSError):
    """The events directory cannot be read (the message names it)."""


@dataclass(frozen=True)
class EventEntry:
    ts: float
    source: str
    kind: str
    fields: dict[str, Any]


@dataclass
class SourceSummary:
    """What one source left: its files, events (and skipped lines), time span and epochs."""

    source: str
    files: int = 0
    events: int = 0
    skipped: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    epochs: set[int] = field(default_factory=set)

    def add(self, entry: EventEntry) -> None:
        self.events += 1
        self.first_ts = entry.ts if self.first_ts is None else min(self.first_ts, entry.ts)
        self.last_ts = entry.ts if self.last_ts is None else max(self.last_ts, entry.ts)
        epoch = entry.fields.get("epoch")
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            self.epochs.add(epoch)


@dataclass
class Timeline:
    entries: list[EventEntry]
    sources: dict[str, SourceSummary]


def parse_event_line(line: str, source: str) -> EventEntry | None:
    """One line as an event (None: not one)."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    ts, kind = value.pop("ts", None), value.pop("kind", None)
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not isinstance(kind, str):
        return None
    return EventEntry(float(ts), source, kind, value)


def parse_event_text(text: str, source: str) -> tuple[list[EventEntry], int]:
    """The events of one file's text, and how many non-empty lines were skipped."""
    entries: list[EventEntry] = []
    skipped = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        entry = parse_event_line(line, source)
        if entry is None:
            skipped += 1
        else:
            entries.append(entry)
    return entries, skipped


def read_timeline(directory: Path, sources: Collection[str] | None = None) -> Timeline:
    """Every event under `directory` (only of `sources` when given), oldest first; raises
    `EventsDirError` when the directory cannot be listed."""
    try:
        subdirs = sorted(p for p in directory.iterdir() if p.is_dir())
    except OSError as exc:
        raise EventsDirError(f"cannot read the events directory {directory}: {exc}") from exc
    entries: list[EventEntry] = []
    summaries: dict[str, SourceSummary] = {}
    for subdir in subdirs:
        source = subdir.name
        if sources is not None and source not in sources:
            continue
        summary = summaries.setdefault(source, SourceSummary(source))
        for path in sorted(subdir.glob(f"*{FILE_SUFFIX}")):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                summary.skipped += 1
                continue
            found, skipped = parse_event_text(text, source)
            summary.files += 1
            summary.skipped += skipped
            for entry in found:
                summary.add(entry)
            entries.extend(found)
    entries.sort(key=lambda e: e.ts)  # stable: one source's events keep their file order
    return Timeline(entries, summaries)
