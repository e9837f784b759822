"""A timeline of events as text lines (pure): `render_timeline` for `psyche-server observe`.

Each line is `YYYY-MM-DD HH:MM:SS.mmm  SOURCE    what happened`, the source shortened to 8
characters (a client's id prefix, `coordina` for the server). A coordinator record is told
against the one before it: who joined, who left and whose state changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from psyche_common.events.timeline import EventEntry, SourceSummary

SOURCE_WIDTH = 8


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _number(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _bytes(value: object) -> str:
    if not isinstance(value, int | float):
        return str(value)
    size = float(value)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _clients(fields: Mapping[str, Any]) -> dict[str, str]:
    clients = fields.get("clients")
    if not isinstance(clients, list):
        return {}
    found = {}
    for item in clients:
        if isinstance(item, list) and len(item) == 2:
            found[str(item[0])] = str(item[1])
    return found


def describe_coordinator(fields: Mapping[str, Any], previous: Mapping[str, Any] | None) -> str:
    clients = _clients(fields)
    text = (
        f"{fields.get('run_state')} epoch {fields.get('epoch')} step {fields.get('step')}, "
        f"{len(clients)} client(s)"
    )
    before = _clients(previous or {})
    changes = [f"+{c}" for c in clients if c not in before]
    changes += [f"-{c}" for c in before if c not in clients]
    changes += [
        f"{c} {before[c]}->{s}" for c, s in clients.items() if c in before and before[c] != s
    ]
    if changes:
        text += " (" + ", ".join(changes) + ")"
    return text


def describe_step(fields: Mapping[str, Any]) -> str:
    figures = fields.get("figures")
    figures = figures if isinstance(figures, dict) else {}
    parts = [f"step {fields.get('step')} finished"]
    if "train/loss" in figures:
        parts.append(f"loss {_number(figures['train/loss'])}")
    if "train/tokens_per_sec" in figures:
        parts.append(f"{_number(figures['train/tokens_per_sec'])} tok/s")
    if "p2p/bytes_up" in figures or "p2p/bytes_down" in figures:
        parts.append(
            f"up {_bytes(figures.get('p2p/bytes_up', 0))} "
            f"down {_bytes(figures.get('p2p/bytes_down', 0))}"
        )
    if "round/seconds" in figures:
        parts.append(f"{_number(figures['round/seconds'])} s")
    if len(parts) == 1:  # not a step's own figures (eval scores, optimizer statistics)
        return f"step {fields.get('step')}: " + " ".join(
            f"{k}={_number(v)}" for k, v in list(figures.items())[:8]
        )
    return ", ".join(parts)


def describe(entry: EventEntry, previous_coordinator: Mapping[str, Any] | None = None) -> str:
    """What one event says, in words."""
    fields = entry.fields
    if entry.kind == "coordinator":
        return describe_coordinator(fields, previous_coordinator)
    if entry.kind == "run_started":
        return (
            f"started: run {fields.get('run_id')!r}, {fields.get('version')}, "
            f"epoch {fields.get('epoch')}"
        )
    if entry.kind == "state_changed":
        old = fields.get("old_state")
        change = f"{old} -> " if old is not None else "first state "
        return (
            f"{change}{fields.get('new_state')} "
            f"(epoch {fields.get('epoch')}, step {fields.get('step')})"
        )
    if entry.kind == "step":
        return describe_step(fields)
    if entry.kind == "log":
        extra = " ".join(
            f"{k}={_number(v)}" for k, v in fields.items() if k not in ("level", "msg", "logger")
        )
        text = f"{fields.get('level')} {fields.get('msg')}"
        return f"{text} {extra}" if extra else text
    rest = " ".join(f"{k}={_number(v)}" for k, v in fields.items())
    return f"{entry.kind} {rest}".rstrip()


def render_timeline(entries: Iterable[EventEntry]) -> Iterator[str]:
    """One line per event, in the order given."""
    previous: dict[str, Mapping[str, Any]] = {}
    for entry in entries:
        text = describe(entry, previous.get(entry.source))
        if entry.kind == "coordinator":
            previous[entry.source] = entry.fields
        yield f"{_when(entry.ts)}  {entry.source[:SOURCE_WIDTH]:<{SOURCE_WIDTH}}  {text}"


def render_summary(sources: Mapping[str, SourceSummary]) -> Iterator[str]:
    """One line per source: files, events, time span, epochs, lines skipped."""
    for summary in sources.values():
        span = (
            "no events"
            if summary.first_ts is None or summary.last_ts is None
            else f"{_when(summary.first_ts)} .. {_when(summary.last_ts)}"
        )
        epochs = sorted(summary.epochs)
        epoch_text = f"epochs {epochs[0]}-{epochs[-1]}" if epochs else "no epoch"
        line = (
            f"{summary.source}: {summary.files} file(s), {summary.events} event(s), {span}, "
            f"{epoch_text}"
        )
        if summary.skipped:
            line += f", {summary.skipped} unreadable line(s) skipped"
        yield line
