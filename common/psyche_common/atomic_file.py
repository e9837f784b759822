"""Writing a file atomically: readers see the old file or the complete new one, never a part.

The bytes go to a hidden temporary file in the same directory (same file system), are flushed
and fsynced, the file is then renamed over the target, and the directory is fsynced so the
rename itself survives a power loss (`fsync_directory`). On any error the temporary file is
removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """A binary file handle whose content replaces `path` when the `with` block succeeds.

    Creates the parent directories."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make the entries of `directory` (a rename into it) durable; a no-op where directories
    cannot be opened (Windows)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (PermissionError, IsADirectoryError):
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
