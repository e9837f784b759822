"""`atomic_writer`: the target holds the old or the complete new content, never a part."""

from __future__ import annotations

from pathlib import Path

import pytest
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
