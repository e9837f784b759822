"""Turning text documents into token files (``psyche-data tokenize``).

Inputs: ``.jsonl`` (one JSON object per line, text in ``text_field``), ``.parquet`` (a string
column ``text_field``) and any other file as plain UTF-8 text (the whole file is one
document). With a ``tokenizers`` ``tokenizer.json`` each document is encoded with the
tokenizer's own template (``add_special_tokens=True``: llama2 and llama3 prepend their BOS,
GPT-2 adds nothing) and then its end-of-text token is appended when the tokenizer defines one
(``</s>``, ``<|endoftext|>``, ``<|end_of_text|>``, ``<eos>``; or the one named explicitly), so
documents stay separated in the flat stream. Without a tokenizer the UTF-8 bytes are the tokens
(vocabulary 256, no separators), like the builtin corpus.

Output: ``part-00000.bin``, ``part-00001.bin``, … (little-endian u16 or u32, each at most
``shard_tokens`` tokens, written to a temporary name and renamed) and ``metadata.json``
recording the token size, tokenizer and counts (the Local provider reads the token size).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from psyche_common.data.errors import DataFileError
from psyche_common.data.token_files import TOKENIZE_METADATA as METADATA_FILE

EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>")
ENCODE_BATCH = 256
DEFAULT_SHARD_TOKENS = 1 << 28


def iter_documents(path: Path, text_field: str = "text") -> Iterator[tuple[str, int]]:
    """(document text, input bytes it accounts for) of one input file."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open("rb") as f:
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    yield "", len(line)
                    continue
                try:
                    record = json.loads(line)
                    text = record[text_field]
                except (ValueError, KeyError, TypeError) as exc:
                    raise DataFileError(
                        f"{path}:{line_number}: no string field {text_field!r} ({exc})"
                    ) from None
                if not isinstance(text, str):
                    raise DataFileError(f"{path}:{line_number}: {text_field!r} is not a string")
                yield text, len(line)
    elif suffix == ".parquet":
        yield from _parquet_documents(path, text_field)
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise DataFileError(f"{path} is not UTF-8 text: {exc}") from None
        yield text, path.stat().st_size


def _parquet_documents(path: Path, text_field: str) -> Iterator[tuple[str, int]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (OSError, ValueError) as exc:
        raise DataFileError(f"cannot read parquet file {path}: {exc}") from None
    if text_field not in parquet.schema_arrow.names:
        raise DataFileError(
            f"{path} has no column {text_field!r} (columns: {', '.join(parquet.schema_arrow.names)})"
        )
    rows = max(parquet.metadata.num_rows, 1)
    per_row = path.stat().st_size / rows
    for batch in parquet.iter_batches(columns=[text_field], batch_size=1024):
        for value in batch.column(0).to_pylist():
            if value is not None and not isinstance(value, str):
                raise DataFileError(f"{path}: column {text_field!r} holds {type(value).__name__}")
            yield value or "", int(per_row)


@dataclass
class Encoder:
    """Turns a batch of documents into token id lists; ``vocab_size`` bounds the ids."""

    name: str
    vocab_size: int
    encode_batch: Callable[[list[str]], list[list[int]]]
    eos_id: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


def byte_encoder() -> Encoder:
    return Encoder("bytes", 256, lambda texts: [list(t.encode("utf-8")) for t in texts])


def find_eos(tokenizer: Any, explicit: str | None) -> int | None:
    """The id of ``explicit``, else of the first known end-of-text token the tokenizer has."""
    names = (explicit,) if explicit else EOS_CANDIDATES
    for name in names:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return int(token_id)
    if explicit:
        raise DataFileError(f"the tokenizer has no token {explicit!r}")
    return None


def tokenizer_encoder(path: Path, eos: bool = True, eos_token: str | None = None) -> Encoder:
    """Encode with a ``tokenizers`` tokenizer.json (its template, then EOS if it has one)."""
    import tokenizers

    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:
        raise DataFileError(f"cannot load tokenizer {path}: {exc}") from None
    eos_id = find_eos(tokenizer, eos_token) if eos else None

    def encode_batch(texts: list[str]) -> list[list[int]]:
        encoded = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=True)]
        if eos_id is not None:
            encoded = [ids if ids[-1:] == [eos_id] else [*ids, eos_id] for ids in encoded]
        return encoded

    return Encoder(
        str(path),
        tokenizer.get_vocab_size(with_added_tokens=True),
        encode_batch,
        eos_id,
    )


def choose_token_size(vocab_size: int, requested: int | None) -> int:
    """2 bytes when every id fits in u16, else 4; a requested size must fit the vocabulary."""
    needed = 2 if vocab_size <= 1 << 16 else 4
    if requested is None:
        return needed
    if requested not in (2, 4):
        raise DataFileError(f"token size must be 2 or 4, got {requested}")
    if requested < needed:
        raise DataFileError(
            f"the vocabulary has {vocab_size} tokens: ids do not fit in {requested} bytes"
        )
    return requested


class ShardWriter:
    """Appends tokens to ``part-NNNNN.bin`` files of at most ``shard_tokens`` tokens each."""

    def __init__(self, directory: Path, token_size: int, shard_tokens: int) -> None:
        if shard_tokens <= 0:
            raise DataFileError(f"shard size must be positive, got {shard_tokens}")
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.dtype = np.dtype("<u2") if token_size == 2 else np.dtype("<u4")
        self.shard_tokens = shard_tokens
        self.paths: list[Path] = []
        self.total_tokens = 0
        self._handle: Any = None
        self._in_shard = 0

    def _temporary(self, path: Path) -> Path:
        return path.with_name(f".{path.name}.tmp")

    def _open_next(self) -> None:
        self._close_current()
        path = self.directory / f"part-{len(self.paths):05d}.bin"
        self.paths.append(path)
        self._handle = self._temporary(path).open("wb")
        self._in_shard = 0

    def _close_current(self) -> None:
        if self._handle is not None:
            self._handle.close()
            os.replace(self._temporary(self.paths[-1]), self.paths[-1])
            self._handle = None

    def write(self, tokens: Sequence[int]) -> None:
        array = np.asarray(tokens, dtype=np.int64)
        if len(array) and (array.min() < 0 or array.max() > np.iinfo(self.dtype).max):
            raise DataFileError(f"token id {int(array.max())} does not fit in {self.dtype}")
        array = array.astype(self.dtype)
        while len(array):
            if self._handle is None or self._in_shard == self.shard_tokens:
                self._open_next()
            take = min(len(array), self.shard_tokens - self._in_shard)
            self._handle.write(array[:take].tobytes())
            self._in_shard += take
            self.total_tokens += take
            array = array[take:]

    def close(self) -> None:
        self._close_current()


@dataclass(frozen=True)
class TokenizeSummary:
    """What `tokenize_files` wrote: the token files, document and token counts, token size."""

    files: list[Path]
    documents: int
    tokens: int
    token_size: int


def _batched(items: Iterable[tuple[str, int]], size: int) -> Iterator[list[tuple[str, int]]]:
    batch: list[tuple[str, int]] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def tokenize_files(
    inputs: Sequence[Path],
    output: Path,
    encoder: Encoder,
    token_size: int | None = None,
    text_field: str = "text",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    progress: Callable[[int], None] = lambda consumed: None,
) -> TokenizeSummary:
    """Encode every document of ``inputs`` into token shards under ``output``."""
    if not inputs:
        raise DataFileError("no input files given")
    for path in inputs:
        if not path.is_file():
            raise DataFileError(f"input {path} is not a file")
    width = choose_token_size(encoder.vocab_size, token_size)
    writer = ShardWriter(output, width, shard_tokens)
    documents = 0
    try:
        for path in inputs:
            for batch in _batched(iter_documents(path, text_field), ENCODE_BATCH):
                texts = [text for text, _ in batch if text]
                for ids in encoder.encode_batch(texts) if texts else []:
                    writer.write(ids)
                documents += len(texts)
                progress(sum(consumed for _, consumed in batch))
    finally:
        writer.close()
    metadata = {
        "token_size": width,
        "tokenizer": encoder.name,
        "vocab_size": encoder.vocab_size,
        "eos_id": encoder.eos_id,
        "documents": documents,
        "tokens": writer.total_tokens,
        "files": [p.name for p in writer.paths],
        "inputs": [str(p) for p in inputs],
    }
    (output / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    return TokenizeSummary(writer.paths, documents, writer.total_tokens, width)
