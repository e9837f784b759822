"""When a watched file's change has settled: pure decisions over the (mtime, size) signatures
that polls of the file saw, no I/O.

A file that an editor or a copy writes in pieces can be polled half-written; read then, it may
parse and yet lack lines. `SettleWatch` therefore lets a poll read a changed file only once the
same new signature was seen at two consecutive polls (it stayed unchanged for one whole poll
interval). A stat that fails counts as the signature `UNREADABLE`, so a file that stays missing
settles too (and its read then fails).
"""

from __future__ import annotations

from dataclasses import dataclass

Signature = tuple[int, int]
"""A file's (modification time in ns, size in bytes)."""

UNREADABLE: Signature = (-1, -1)
"""The signature of a file whose stat failed (missing, no permission)."""


@dataclass
class SettleWatch:
    """The signature last read (`read`) and a change seen but not settled yet (`seen`)."""

    read: Signature | None = None
    """What the file was when it was last read, whether it parsed or not (None: never)."""
    seen: Signature | None = None
    """A signature other than `read` that the previous poll saw (None: none pending)."""

    def poll(self, signature: Signature) -> bool:
        """A poll saw `signature`: True when the file should be read now (it changed since it
        was last read and the previous poll saw it exactly so)."""
        if signature == self.read:
            self.seen = None
            return False
        if signature != self.seen:
            self.seen = signature
            return False
        return True

    def was_read(self, signature: Signature) -> None:
        """The file was read as `signature` (a reload, or a forced one on SIGHUP)."""
        self.read = signature
        self.seen = None
