"""`EventFileWriter`: appends a process's events to its event files, one file per epoch.

Layout: `DIR/{source}/events-epoch-{E}-{YYYY-MM-DDTHH-MM-SSZ}.jsonl`, where `source` is the
client's id (64 hex characters) or `coordinator` for the server. Each line is one JSON object
with `ts` (unix seconds), `kind` and the event's fields; each file starts with a `run_started`
line carrying the writer's context (run id, source, version), so a file read alone still says
whose it is. A line is written and flushed at once (no fsync): a crash loses at most the line
being written, and a reader skips a cut-off last line.

The file rotates when the writer is told of a later epoch (`start_epoch`); after a rotation only
the newest `keep_files` files this writer created are kept (None: all). Files already in the
directory from another process are never deleted. Writing never raises once the first file is
open: a failed write (a full disk) is logged once and later events are dropped and counted.
Any thread may write (a lock keeps lines whole).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("psyche.events")

COORDINATOR_SOURCE = "coordinator"
"""The subdirectory the server's records go to (clients use their id)."""
FILE_SUFFIX = ".jsonl"
MAX_TEXT = 2000
"""Characters kept of one text field (a long error message is cut)."""


class EventFileError(OSError):
    """The events directory or its first file cannot be created (the message says which)."""


def _plain(value: object) -> Any:
    """`value` as JSON can hold it: bytes as hex, long text cut, non-finite floats as None."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + "..."
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bool | int) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return _plain(str(value))


def event_line(ts: float, kind: str, fields: Mapping[str, object]) -> str:
    """One event as its line (newline included)."""
    entry: dict[str, Any] = {"ts": round(ts, 3), "kind": kind}
    for key, value in fields.items():
        entry.setdefault(key, _plain(value))
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n"


def file_name(epoch: int, ts: float) -> str:
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H-%M-%SZ")
    return f"events-epoch-{epoch}-{stamp}{FILE_SUFFIX}"


class EventFileWriter:
    """Writes one source's events under `directory / source` (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        source: str,
        context: Mapping[str, object],
        keep_files: int | None = 5,
        epoch: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if keep_files is not None and keep_files < 1:
            raise ValueError(f"keep_files must be at least 1, got {keep_files}")
        self.directory = directory / source
        self.context = dict(context, source=source)
        self.keep_files = keep_files
        self.epoch = epoch
        self.clock = clock
        self.dropped = 0
        """Events not written because a write failed."""
        self.created: deque[Path] = deque()
        self._file: IO[str] | None = None
        self._lock = threading.RLock()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._open()
        except OSError as exc:
            raise EventFileError(f"cannot write event files in {self.directory}: {exc}") from exc

    @property
    def path(self) -> Path | None:
        """The file being written (None once closed or after a failed write)."""
        return self.created[-1] if self._file is not None and self.created else None

    def _open(self) -> None:
        now = self.clock()
        base = self.directory / file_name(self.epoch, now)
        path, n = base, 0
        while path.exists():  # a restart within the same second
            n += 1
            path = base.with_name(f"{base.stem}-{n}{FILE_SUFFIX}")
        self._file = path.open("a", encoding="utf-8")
        self.created.append(path)
        self._file.write(event_line(now, "run_started", {**self.context, "epoch": self.epoch}))
        self._file.flush()

    def write(self, kind: str, fields: Mapping[str, object] | None = None) -> None:
        """Append one event (quick: one line, flushed; never raises)."""
        line = event_line(self.clock(), kind, fields or {})
        with self._lock:
            if self._file is None:
                self.dropped += 1
                return
            try:
                self._file.write(line)
                self._file.flush()
            except (OSError, ValueError) as exc:
                self._fail(exc)

    def start_epoch(self, epoch: int) -> None:
        """Later events belong to `epoch`: a later one than the file's starts a new file and
        removes the oldest beyond `keep_files`."""
        with self._lock:
            if epoch <= self.epoch or self._file is None:
                return
            self.epoch = epoch
            try:
                self._file.close()
                self._open()
            except OSError as exc:
                self._fail(exc)
                return
            self._prune()

    def _prune(self) -> None:
        while self.keep_files is not None and len(self.created) > self.keep_files:
            old = self.created.popleft()
            try:
                os.unlink(old)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not delete the old event file %s: %s", old, exc)

    def _fail(self, exc: BaseException) -> None:
        self.dropped += 1
        self._close_file()
        log.warning(
            "event files: writing to %s failed (%s); later events are dropped",
            self.directory,
            exc,
        )

    def _close_file(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def close(self) -> None:
        with self._lock:
            self._close_file()
