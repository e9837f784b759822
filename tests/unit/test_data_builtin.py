"""The builtin python-stdlib corpus: contents, cache, atomic build, splits, provider."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from psyche_common.batch_id import BatchId
from psyche_common.data.builtin import (
    BuiltinDataProvider,
    build_python_stdlib,
    default_cache_dir,
    python_stdlib_cache_path,
    python_stdlib_files,
    python_stdlib_splits,
    python_stdlib_tokens,
    split_tokens,
)
from psyche_common.data.errors import DataFileError


def test_stdlib_files_sorted_without_site_packages(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "b" / "z.py").write_text("z")
    (tmp_path / "a.py").write_text("a")
    (tmp_path / "c.txt").write_text("c")
    (tmp_path / "site-packages" / "x.py").write_text("x")
    assert [p.relative_to(tmp_path).as_posix() for p in python_stdlib_files(tmp_path)] == [
        "a.py",
        "b/z.py",
    ]


def test_build_concatenates_bytes_as_u16(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.py").write_bytes(b"ab")
    (source / "b.py").write_bytes("é".encode())
    out = build_python_stdlib(tmp_path / "cache" / "corpus.bin", source)
    assert np.fromfile(out, dtype="<u2").tolist() == [97, 98, 0xC3, 0xA9]
    assert [p.name for p in out.parent.iterdir()] == ["corpus.bin"]  # no temporary left


def test_build_of_empty_tree_fails(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=r"no \*\.py files"):
        build_python_stdlib(tmp_path / "c.bin", tmp_path)


def test_cache_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PSYCHE_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("PSYCHE_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "psyche"


def test_split_is_last_five_percent() -> None:
    train, validation = split_tokens(np.arange(100))
    assert len(train) == 95 and validation.tolist() == list(range(95, 100))


def test_real_corpus_is_built_once_and_reused(tmp_path: Path) -> None:
    tokens = python_stdlib_tokens(tmp_path)
    path = python_stdlib_cache_path(tmp_path)
    assert path.is_file() and tokens.dtype == np.dtype("<u2") and int(tokens.max()) < 256
    first_file = python_stdlib_files()[0].read_bytes()
    assert bytes(np.asarray(tokens[: len(first_file)], dtype=np.uint8)) == first_file
    mtime = os.stat(path).st_mtime_ns
    train, validation = python_stdlib_splits(tmp_path)
    assert os.stat(path).st_mtime_ns == mtime
    assert len(train) + len(validation) == len(tokens)
    assert len(validation) == int(len(tokens) * 0.05)


async def test_builtin_provider(tmp_path: Path) -> None:
    provider = BuiltinDataProvider("python-stdlib", 64, tmp_path)
    train, _ = python_stdlib_splits(tmp_path)
    assert provider.num_sequences == len(train) // 64
    samples = await provider.get_samples(BatchId(0, 3))
    assert samples.shape == (4, 64) and samples.dtype == np.int64
    again = BuiltinDataProvider("python-stdlib", 64, tmp_path)
    assert (await again.get_samples(BatchId(0, 3))).tolist() == samples.tolist()
    validation = BuiltinDataProvider("python-stdlib", 64, tmp_path, split="validation")
    assert validation.num_sequences < provider.num_sequences


def test_unknown_builtin_corpus(tmp_path: Path) -> None:
    with pytest.raises(
        DataFileError, match="unknown builtin corpus 'nope'; available: python-stdlib"
    ):
        BuiltinDataProvider("nope", 64, tmp_path)


def test_concurrent_builds_never_leave_a_partial_file(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    source = tmp_path / "src"
    source.mkdir()
    for index in range(20):
        (source / f"m{index:02}.py").write_bytes(bytes([65 + index]) * 5000)
    destination = tmp_path / "cache" / "corpus.bin"
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: build_python_stdlib(destination, source), range(8)))
    tokens = np.fromfile(destination, dtype="<u2")
    assert len(tokens) == 100_000 and tokens[0] == 65 and tokens[-1] == 84
    assert [p.name for p in destination.parent.iterdir()] == ["corpus.bin"]
