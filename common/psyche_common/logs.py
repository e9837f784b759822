"""Process-wide logging set-up shared by every CLI: console text or JSON lines.

JSON lines are one object per line with `ts` (ISO-8601 UTC), `level`, `logger`, `msg`, plus every
structured field passed with `logger.info(..., extra={...})`. Exceptions add `exc_info` text.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

LogFormat = Literal["console", "json"]
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error", "critical")
"""The level names CLIs accept for `--log-level` (any case)."""

_HANDLER_NAME = "psyche"
"""The name of the root handler `setup_logging` installs (and replaces when called again)."""

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_RECORD_FIELDS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
) | {"message", "asctime", "taskName"}


def record_extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a caller attached to `record` through `extra=`."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD_RECORD_FIELDS}


def _json_safe(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg and the `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record_extra_fields(record).items():
            entry.setdefault(key, _json_safe(value))
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    """`HH:MM:SS LEVEL logger: msg key=value ...` for humans."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-5s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extras = record_extra_fields(record)
        if extras:
            text += " " + " ".join(f"{k}={_json_safe(v)}" for k, v in extras.items())
        return text


def make_formatter(fmt: LogFormat) -> logging.Formatter:
    if fmt == "json":
        return JsonLineFormatter()
    if fmt == "console":
        return ConsoleFormatter()
    raise ValueError(f"unknown log format {fmt!r} (expected 'console' or 'json')")


def setup_logging(
    fmt: LogFormat = "console",
    level: int | str = logging.INFO,
    file: str | Path | None = None,
    stream: TextIO | None = None,
) -> None:
    """Configure the root logger: one handler to `file` (appended) or to `stream` (stderr).

    Calling it again replaces the handlers it installed before."""
    root = logging.getLogger()
    for installed in list(root.handlers):
        if installed.get_name() == _HANDLER_NAME:
            root.removeHandler(installed)
            installed.close()
    handler: logging.Handler
    if file is not None:
        Path(file).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(make_formatter(fmt))
    handler.set_name(_HANDLER_NAME)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
