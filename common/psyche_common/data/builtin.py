"""Builtin corpora built on the machine itself, so a run needs no downloaded data (our addition).

``python-stdlib``: the bytes of every ``*.py`` file under ``os.path.dirname(os.__file__)``
(``site-packages`` excluded), sorted by relative path and concatenated; each byte is a token
(vocabulary 256). It is built once and cached as a u16 token file under
``$PSYCHE_CACHE_DIR`` (default ``~/.cache/psyche``), written to a temporary file and renamed,
so concurrent clients never see a partial file. The cache name carries the Python version and
the stdlib path, because the corpus is only identical across machines with the same Python.

The last 5 % of the tokens are the validation split; the provider serves the first 95 %,
cut into ``seq_len`` sequences and shuffled with a fixed seed (``BUILTIN_SHUFFLE_SEED``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from psyche_common.atomic_file import atomic_writer
from psyche_common.config.data_location import BUILTIN_DATASETS
from psyche_common.config.enums import TokenSize
from psyche_common.data.errors import DataFileError
from psyche_common.data.token_files import (
    TokenSequences,
    TokenSequencesProvider,
    open_token_file,
)

logger = logging.getLogger(__name__)

PYTHON_STDLIB = "python-stdlib"
BUILTIN_VOCAB_SIZE = 256
VALIDATION_FRACTION = 0.05
BUILTIN_SHUFFLE_SEED = hashlib.sha256(b"psyche builtin corpus shuffle").digest()


def default_cache_dir() -> Path:
    """``$PSYCHE_CACHE_DIR``, or ``~/.cache/psyche``."""
    configured = os.environ.get("PSYCHE_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "psyche"


def stdlib_root() -> Path:
    return Path(os.path.dirname(os.__file__))


def python_stdlib_files(root: Path | None = None) -> list[Path]:
    """Every ``*.py`` under ``root`` (default: the stdlib) outside ``site-packages``, by path."""
    base = root or stdlib_root()
    found: list[tuple[str, Path]] = []
    for directory, subdirs, files in os.walk(base):
        subdirs[:] = [d for d in subdirs if d != "site-packages"]
        for name in files:
            if name.endswith(".py"):
                path = Path(directory) / name
                found.append((path.relative_to(base).as_posix(), path))
    return [path for _, path in sorted(found)]


def python_stdlib_cache_path(cache_dir: Path) -> Path:
    """Cache file name: Python implementation + version and a digest of the stdlib path."""
    root_digest = hashlib.sha256(str(stdlib_root()).encode()).hexdigest()[:12]
    version = platform.python_version()
    return cache_dir / f"{PYTHON_STDLIB}-{sys.implementation.name}{version}-{root_digest}.u16.bin"


def _iter_corpus_bytes(files: list[Path]) -> Iterator[bytes]:
    for path in files:
        yield path.read_bytes()


def build_python_stdlib(destination: Path, root: Path | None = None) -> Path:
    """Write the corpus to ``destination`` atomically (temporary file, then rename)."""
    files = python_stdlib_files(root)
    if not files:
        raise DataFileError(f"no *.py files found under {root or stdlib_root()}")
    with atomic_writer(destination) as handle:
        for chunk in _iter_corpus_bytes(files):
            handle.write(np.frombuffer(chunk, dtype=np.uint8).astype("<u2").tobytes())
    logger.info("built the %s corpus from %d files at %s", PYTHON_STDLIB, len(files), destination)
    return destination


def python_stdlib_tokens(cache_dir: str | os.PathLike[str] | None = None) -> np.ndarray:
    """The whole corpus as a memory-mapped u16 array (built on first use)."""
    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = python_stdlib_cache_path(directory)
    if not path.is_file():
        try:
            build_python_stdlib(path)
        except OSError as exc:
            raise DataFileError(
                f"cannot build the {PYTHON_STDLIB} corpus at {path}: {exc}"
            ) from None
    return open_token_file(path, TokenSize.TWO_BYTES)


def split_tokens(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation): the validation split is the last 5 % of the tokens."""
    boundary = len(tokens) - int(len(tokens) * VALIDATION_FRACTION)
    return tokens[:boundary], tokens[boundary:]


def python_stdlib_splits(
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) u16 token arrays of the python-stdlib corpus (memory-mapped views)."""
    return split_tokens(python_stdlib_tokens(cache_dir))


class BuiltinDataProvider(TokenSequencesProvider):
    """Shuffled ``seq_len`` sequences of a builtin corpus's train (or validation) split."""

    def __init__(
        self,
        name: str,
        seq_len: int,
        cache_dir: str | os.PathLike[str] | None = None,
        split: str = "train",
    ) -> None:
        if name not in BUILTIN_DATASETS:
            raise DataFileError(
                f"unknown builtin corpus {name!r}; available: {', '.join(BUILTIN_DATASETS)}"
            )
        if split not in ("train", "validation"):
            raise DataFileError(f"split must be 'train' or 'validation', got {split!r}")
        train, validation = python_stdlib_splits(cache_dir)
        tokens = train if split == "train" else validation
        self.name = name
        self.seq_len = seq_len
        self.vocab_size = BUILTIN_VOCAB_SIZE
        self.sequences = TokenSequences(
            [tokens], [f"builtin:{name}/{split}"], seq_len, BUILTIN_SHUFFLE_SEED
        )

    def __repr__(self) -> str:
        return f"BuiltinDataProvider({self.name!r}, seq_len={self.seq_len})"
