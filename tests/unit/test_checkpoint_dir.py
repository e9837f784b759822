"""Checkpoint directories are written atomically and pruned without counting partial ones
(`psyche_client.training.model.checkpoint_dir`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import psyche_client.training.model.checkpoint_dir as checkpoint_dir
import pytest
from psyche_client.training.model.checkpoint_dir import (
    complete_checkpoints,
    prune_checkpoints,
    temporary_checkpoints,
    write_checkpoint_dir,
)


def writer(content: bytes):
    def write(directory: Path) -> None:
        (directory / "model.safetensors").write_bytes(content)
        (directory / "sub").mkdir()
        (directory / "sub" / "config.json").write_text("{}")

    return write


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_write_creates_the_directory_and_leaves_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints" / "nested"  # created
    target = write_checkpoint_dir(root, "run", 8, writer(b"weights"))
    assert target == root / "run-step8"
    assert names(root) == ["run-step8"]
    assert (target / "model.safetensors").read_bytes() == b"weights"
    assert (target / "sub" / "config.json").read_text() == "{}"
    # an ordinary directory like its parent (the umask applies), not mkdtemp's owner-only 0700
    assert target.stat().st_mode & 0o777 == root.stat().st_mode & 0o777


def test_a_save_interrupted_midway_leaves_no_checkpoint_and_the_old_ones_intact(
    tmp_path: Path,
) -> None:
    write_checkpoint_dir(tmp_path, "run", 4, writer(b"good 4"))
    write_checkpoint_dir(tmp_path, "run", 8, writer(b"good 8"))

    def full_disk(directory: Path) -> None:
        (directory / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    for step in (8, 12):  # replacing an existing checkpoint, and a new one
        with pytest.raises(OSError, match="No space left"):
            write_checkpoint_dir(tmp_path, "run", step, full_disk)
    assert names(tmp_path) == ["run-step4", "run-step8"]
    assert (tmp_path / "run-step8" / "model.safetensors").read_bytes() == b"good 8"
    assert (tmp_path / "run-step4" / "model.safetensors").read_bytes() == b"good 4"


def test_an_existing_checkpoint_is_replaced_only_by_a_complete_one(tmp_path: Path) -> None:
    write_checkpoint_dir(tmp_path, "run", 8, writer(b"old"))
    (tmp_path / "run-step8" / "stale.bin").write_bytes(b"only in the old one")
    write_checkpoint_dir(tmp_path, "run", 8, writer(b"new"))
    assert names(tmp_path) == ["run-step8"]
    assert names(tmp_path / "run-step8") == ["model.safetensors", "sub"]
    assert (tmp_path / "run-step8" / "model.safetensors").read_bytes() == b"new"


def test_a_failed_rename_into_place_puts_the_old_checkpoint_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_checkpoint_dir(tmp_path, "run", 8, writer(b"old"))
    real_rename = os.rename

    def rename(source: str | Path, destination: str | Path) -> None:
        if ".partial-" in Path(source).name:
            raise OSError(errno.EIO, "Input/output error")
        real_rename(source, destination)

    monkeypatch.setattr(checkpoint_dir.os, "rename", rename)
    with pytest.raises(OSError, match="Input/output error"):
        write_checkpoint_dir(tmp_path, "run", 8, writer(b"new"))
    assert names(tmp_path) == ["run-step8"]
    assert (tmp_path / "run-step8" / "model.safetensors").read_bytes() == b"old"


def test_prune_counts_only_complete_checkpoints_and_removes_stale_partials(
    tmp_path: Path,
) -> None:
    for step in (4, 8, 12):
        write_checkpoint_dir(tmp_path, "run", step, writer(b"good"))
    leftovers = [
        ".run-step4.partial-0a1b2c",  # crashed saves of older steps: stale
        ".run-step8.replaced-3d4e5f",
        ".run-step11.pruned-abcdef",
        ".run-step16.partial-0f0f0f",  # newer than the newest checkpoint: not ours to judge yet
        ".other-step2.partial-0a0a0a",  # another run's: never touched
    ]
    for name in leftovers:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"half")
    (tmp_path / "other-step1").mkdir()
    (tmp_path / "run-step3").write_text("a file, not a checkpoint")
    (tmp_path / "run-stepX").mkdir()
    (tmp_path / "run-step٣").mkdir()  # a non-ASCII digit is no step number

    assert [s for s, _ in complete_checkpoints(tmp_path, "run")] == [4, 8, 12]
    assert [s for s, _ in temporary_checkpoints(tmp_path, "run")] == [4, 8, 11, 16]
    removed = prune_checkpoints(tmp_path, "run", keep=2)
    assert removed == [tmp_path / "run-step4"]
    assert names(tmp_path) == sorted(
        [
            ".other-step2.partial-0a0a0a",
            ".run-step16.partial-0f0f0f",
            "other-step1",
            "run-step12",
            "run-step3",
            "run-step8",
            "run-stepX",
            "run-step٣",
        ]
    )
    # the partial of step 16 is not a checkpoint: the two good ones stay
    assert prune_checkpoints(tmp_path, "run", keep=2) == []
    assert (tmp_path / "run-step8" / "model.safetensors").read_bytes() == b"good"


def test_prune_with_keep_zero_keeps_every_checkpoint(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        write_checkpoint_dir(tmp_path, "run", step, writer(b"w"))
    assert prune_checkpoints(tmp_path, "run", keep=0) == []
    assert names(tmp_path) == ["run-step1", "run-step2", "run-step3"]


def test_run_ids_are_matched_literally(tmp_path: Path) -> None:
    write_checkpoint_dir(tmp_path, "a.b", 1, writer(b"w"))
    (tmp_path / "axb-step2").mkdir()
    (tmp_path / ".axb-step0.partial-aa").mkdir()
    assert [p.name for _, p in complete_checkpoints(tmp_path, "a.b")] == ["a.b-step1"]
    assert prune_checkpoints(tmp_path, "a.b", keep=1) == []
    assert names(tmp_path) == [".axb-step0.partial-aa", "a.b-step1", "axb-step2"]


def test_a_removal_cut_short_never_leaves_a_counted_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (4, 8):
        write_checkpoint_dir(tmp_path, "run", step, writer(b"w"))

    def rmtree_cut_short(path: str | Path, ignore_errors: bool = False) -> None:
        (Path(path) / "model.safetensors").unlink(missing_ok=True)  # then it stops, say

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint_dir.shutil, "rmtree", rmtree_cut_short)
        assert prune_checkpoints(tmp_path, "run", keep=1) == [tmp_path / "run-step4"]
    [(step, leftover)] = temporary_checkpoints(tmp_path, "run")
    assert step == 4 and ".run-step4.pruned-" in leftover.name
    assert [s for s, _ in complete_checkpoints(tmp_path, "run")] == [8]
    prune_checkpoints(tmp_path, "run", keep=1)  # the next prune finishes the job
    assert names(tmp_path) == ["run-step8"]
