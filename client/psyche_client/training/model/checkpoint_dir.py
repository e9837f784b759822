"""Checkpoint directories that are never half-written: `{run_id}-step{N}` is absent or complete.

`write_checkpoint_dir` lets the backend write into a hidden sibling
`.{run_id}-step{N}.partial-<random>` (same parent, so the same file system), fsyncs every file
and directory in it, and renames it into place. A directory that already has the name is
replaced only once the new one is complete: it is renamed aside
(`.{run_id}-step{N}.replaced-<random>`), the new one is renamed in, and the old one is removed.
On any error the partial directory is removed and whatever had the name is left as it was.

`prune_checkpoints` keeps the newest few complete directories of a run. Hidden temporary
directories are never counted as checkpoints; a directory being pruned is renamed to one first
(`.pruned-`), so a removal cut short never leaves a half-deleted "complete" checkpoint. Temporary
directories of the run whose step is older than its newest complete checkpoint (left by a
crash, or by a removal cut short) are removed.

No torch here: this module only moves directories around.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

# The kinds of hidden temporary directory a run's checkpoints pass through.
PARTIAL = "partial"
REPLACED = "replaced"
PRUNED = "pruned"
TEMPORARY_KINDS = (PARTIAL, REPLACED, PRUNED)


class CheckpointError(RuntimeError):
    """Saving or uploading a checkpoint failed; the message names the path or repo and why."""


def checkpoint_name(run_id: str, step: int) -> str:
    """The directory name of a run's complete checkpoint at `step`."""
    return f"{run_id}-step{step}"


def _complete_pattern(run_id: str) -> re.Pattern[str]:
    return re.compile(re.escape(run_id) + r"-step([0-9]+)")


def _temporary_pattern(run_id: str) -> re.Pattern[str]:
    kinds = "|".join(TEMPORARY_KINDS)
    return re.compile(r"\." + re.escape(run_id) + r"-step([0-9]+)\.(?:" + kinds + r")-[0-9a-f]+")


def _matching(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    found = []
    for path in directory.iterdir():
        match = pattern.fullmatch(path.name)
        if match is not None and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def complete_checkpoints(directory: Path, run_id: str) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint of the run in `directory`, oldest first."""
    return _matching(directory, _complete_pattern(run_id))


def temporary_checkpoints(directory: Path, run_id: str) -> list[tuple[int, Path]]:
    """(step, path) of the run's hidden partial / replaced / pruned directories, oldest first."""
    return _matching(directory, _temporary_pattern(run_id))


def _temporary_path(directory: Path, run_id: str, step: int, kind: str) -> Path:
    """A name in `directory` that nothing has yet (the caller creates or renames onto it)."""
    while True:
        path = directory / f".{checkpoint_name(run_id, step)}.{kind}-{secrets.token_hex(6)}"
        if not os.path.lexists(path):
            return path


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_tree(root: Path) -> None:
    """Flush every regular file under `root`, then every directory (deepest first)."""
    for current, _, files in os.walk(root, topdown=False):
        for name in files:
            file = Path(current) / name
            if file.is_file() and not file.is_symlink():
                _fsync(file)
        _fsync(Path(current))


def _move_into_place(new: Path, target: Path, aside: Path) -> None:
    """Rename the complete directory `new` to `target`; an existing `target` is moved to
    `aside` first and removed once `new` is in place (put back if that rename fails)."""
    if not os.path.lexists(target):
        try:
            os.rename(new, target)
            return
        except OSError as exc:  # someone else put a directory there meanwhile
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    os.rename(target, aside)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(aside, target)
        raise
    _remove(aside)


def write_checkpoint_dir(
    directory: Path, run_id: str, step: int, write: Callable[[Path], None]
) -> Path:
    """Create `directory/{run_id}-step{step}` atomically from what `write(partial_dir)` puts
    in an empty temporary directory; returns the checkpoint's path.

    Creates `directory` if needed. Whatever `write` or the disk raises propagates, after the
    temporary directory is removed; an existing checkpoint of that name is then untouched."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / checkpoint_name(run_id, step)
    while True:
        partial = _temporary_path(directory, run_id, step, PARTIAL)
        try:
            partial.mkdir()
            break
        except FileExistsError:
            continue
    try:
        write(partial)
        _fsync_tree(partial)
        _move_into_place(partial, target, _temporary_path(directory, run_id, step, REPLACED))
    except BaseException:
        _remove(partial)
        raise
    _fsync(directory)
    return target


def prune_checkpoints(directory: Path, run_id: str, keep: int) -> list[Path]:
    """Keep the newest `keep` complete checkpoints of the run (all of them when `keep` <= 0)
    and remove the run's temporary directories older than its newest checkpoint; returns the
    removed checkpoints. Other runs' directories and unrelated files are never touched."""
    complete = complete_checkpoints(directory, run_id)
    removed = []
    for step, path in complete[:-keep] if keep > 0 else []:
        # renamed out of the way first: a removal cut short leaves a temporary directory
        doomed = _temporary_path(directory, run_id, step, PRUNED)
        os.rename(path, doomed)
        _remove(doomed)
        removed.append(path)
    if complete:
        newest = complete[-1][0]
        for step, path in temporary_checkpoints(directory, run_id):
            if step < newest:
                _remove(path)
    return removed
