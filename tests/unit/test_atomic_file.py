"""`atomic_writer`: the target holds the old or the complete new content, never a part."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from psyche_common import atomic_file
from psyche_common.atomic_file import atomic_writer


def test_writes_and_creates_parent_directories(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "file.bin"
    with atomic_writer(target) as handle:
        handle.write(b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.bin"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "file.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk on fire"), atomic_writer(target) as handle:
        handle.write(b"partial")
        raise RuntimeError("disk on fire")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.bin"]


def test_the_directory_is_fsynced_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename is durable too: the target's directory is fsynced once the file is in
    place (the state directory of `--save-state-dir`, checkpoints)."""
    synced: list[tuple[bool, bool]] = []
    real_fsync = os.fsync
    target = tmp_path / "state" / "run-latest.toml"

    def recording_fsync(descriptor: int) -> None:
        is_dir = stat.S_ISDIR(os.fstat(descriptor).st_mode)
        synced.append((is_dir, target.exists()))
        real_fsync(descriptor)

    monkeypatch.setattr(atomic_file.os, "fsync", recording_fsync)
    with atomic_writer(target) as handle:
        handle.write(b"x")
    assert synced == [(False, False), (True, True)]  # the file's data, then its directory
