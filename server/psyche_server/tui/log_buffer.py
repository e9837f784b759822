"""A logging handler that keeps the last formatted lines for the dashboard's Logs tab."""

from __future__ import annotations

import logging
from collections import deque

from psyche_common.logs import ConsoleFormatter


class LogBuffer(logging.Handler):
    """Appends formatted records to a bounded deque; the dashboard drains `new_lines()`."""

    def __init__(self, capacity: int = 2000) -> None:
        super().__init__()
        self.setFormatter(ConsoleFormatter())
        self.lines: deque[str] = deque(maxlen=capacity)
        self._unread: deque[str] = deque(maxlen=capacity)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            line = f"{record.levelname} {record.name}: {record.msg!r}"
        self.lines.append(line)
        self._unread.append(line)

    def new_lines(self) -> list[str]:
        out = []
        while self._unread:
            out.append(self._unread.popleft())
        return out
