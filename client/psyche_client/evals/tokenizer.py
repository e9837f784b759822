"""The text → token ids an eval needs, for the model the client trains.

A model whose vocabulary is the 256 byte values (the `builtin:` presets trained on the
built-in byte corpus) reads UTF-8 bytes; any other model needs the `tokenizer.json` that came
with it (a local or Hub model directory). A model with neither cannot run lm-eval tasks (the
held-out loss needs no tokenizer: its data is already tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

BYTE_VOCAB_SIZE = 256


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


class ByteTokenizer:
    """Each UTF-8 byte is a token (vocabulary 256)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class FileTokenizer:
    """A Hugging Face `tokenizer.json` (the `tokenizers` library), without special tokens."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        self.path = path
        self._tokenizer = HfTokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)


class NoTokenizer(ValueError):
    """The model came without a tokenizer the evals can use."""


def tokenizer_for(vocab_size: int, files: Sequence[Path]) -> Tokenizer:
    """The tokenizer of a model with `vocab_size` whose directory holds `files`."""
    for path in files:
        if path.name == "tokenizer.json":
            return FileTokenizer(path)
    if vocab_size == BYTE_VOCAB_SIZE:
        return ByteTokenizer()
    raise NoTokenizer(
        f"the model (vocabulary {vocab_size}) came without a tokenizer.json: lm-eval tasks "
        "need one (the held-out loss does not)"
    )
