"""Progress lines for the long waits of a client (the model download from peers, a checkpoint's
save and upload), in the console and JSON logs alike, not only in the dashboard.

`TransferProgress` makes the lines (pure but for its logger and clock): every `interval`
seconds `WHAT: 120.0 MB of 500.0 MB (24%), 12.3 MB/s` and at the end `WHAT: done, 500.0 MB in
40 s (12.5 MB/s)`, each with the fields `progress` (what), `bytes_done`, `bytes_total`,
`bytes_per_sec` and `elapsed_s`. `report_progress` awaits a piece of work and, while it runs,
reads how far it got from a `measure()` function every `interval` seconds; `directory_bytes` is
such a measure for a directory being written.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

INTERVAL = 5.0
"""Seconds between two progress lines."""


def megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"


class TransferProgress:
    """The progress lines of one transfer of `total` bytes (None: not known beforehand)."""

    def __init__(
        self,
        what: str,
        total: int | None,
        logger: logging.Logger,
        *,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        fields: dict[str, object] | None = None,
    ) -> None:
        self.what = what
        self.total = total
        self.interval = interval
        self._log = logger
        self._clock = clock
        self._fields = fields or {}
        self._started = clock()
        self._last_line = self._started

    def line(self, done: int | None, elapsed: float) -> str:
        """`WHAT: 120.0 MB of 500.0 MB (24%), 12.3 MB/s` (`done` None: only the time)."""
        if done is None:
            size = "" if self.total is None else f" of {megabytes(self.total)}"
            return f"{self.what}: {elapsed:.0f} s so far{size}"
        part = megabytes(done)
        if self.total:
            part += f" of {megabytes(self.total)} ({100 * done // self.total}%)"
        rate = f"{megabytes(int(done / elapsed))}/s" if elapsed > 0 else "- MB/s"
        return f"{self.what}: {part}, {rate}"

    def update(self, done: int | None) -> None:
        """Log a line when `interval` seconds have passed since the last one."""
        if self._clock() - self._last_line >= self.interval:
            self.report(done)

    def report(self, done: int | None) -> None:
        """Log a line now."""
        now = self._clock()
        self._last_line = now
        self._emit(self.line(done, now - self._started), done, now)

    def finish(self, done: int | None) -> None:
        """The last line: how much, how long, how fast on average."""
        now = self._clock()
        elapsed = now - self._started
        moved = self.total if done is None else done
        size = "" if moved is None else f"{megabytes(moved)} in "
        rate = (
            f" ({megabytes(int(moved / elapsed))}/s)" if moved is not None and elapsed > 0 else ""
        )
        self._emit(f"{self.what}: done, {size}{elapsed:.0f} s{rate}", moved, now)

    def _emit(self, message: str, done: int | None, now: float) -> None:
        elapsed = now - self._started
        self._log.info(
            "%s",
            message,
            extra={
                **self._fields,
                "progress": self.what,
                "bytes_done": done,
                "bytes_total": self.total,
                "bytes_per_sec": None if done is None or elapsed <= 0 else round(done / elapsed),
                "elapsed_s": round(elapsed, 1),
            },
        )


async def report_progress(
    progress: TransferProgress, measure: Callable[[], int | None], work: Awaitable[T]
) -> T:
    """Await `work`; meanwhile log `measure()` every `progress.interval` seconds, and the last
    line once it succeeded (a failure is for the caller to log)."""

    async def tick() -> None:
        while True:
            await asyncio.sleep(progress.interval)
            progress.report(measure())

    ticker = asyncio.create_task(tick())
    try:
        result = await work
    finally:  # the ticker never outlives the work (an error of the work stays unwrapped)
        ticker.cancel()
        await asyncio.wait([ticker])
    progress.finish(measure())
    return result


def directory_bytes(path: Path) -> int:
    """The bytes of the files under `path` now (0 when it does not exist); a file that
    vanishes while it is counted (a directory being written and renamed) counts 0."""
    total = 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                total += directory_bytes(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total
