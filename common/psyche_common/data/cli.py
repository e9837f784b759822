"""``psyche-data``: tokenize text into token files, and inspect/decode token files.

``inspect`` prints exactly one sequence on stdout (token ids separated by spaces and a newline,
or the decoded text as is) and nothing else; errors go to stderr with exit status 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from psyche_common.data.errors import DataError
from psyche_common.data.sequence_index import parse_shuffle
from psyche_common.data.token_files import (
    DATA_FILE_EXTENSIONS,
    TokenSequences,
    list_token_files,
    parse_token_size,
    recorded_token_size,
)


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


_SEED_OPTION = "'--shuffle-seed'"


def _parse_seed(text: str) -> bytes:
    """A seed as 64 hex digits or 32 comma-separated integers (data.toml's shuffle_seed)."""
    cleaned = text.strip().strip("[]")
    if "," in cleaned:
        try:
            values = [int(v) for v in cleaned.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(
                f"not a list of integers: {text!r}", param_hint=_SEED_OPTION
            ) from None
    else:
        try:
            values = list(bytes.fromhex(cleaned))
        except ValueError:
            raise click.BadParameter(
                "expected 64 hex digits or 32 integers 0-255", param_hint=_SEED_OPTION
            ) from None
    try:
        seed = parse_shuffle(values)
    except DataError as exc:
        raise click.BadParameter(str(exc), param_hint=_SEED_OPTION) from None
    assert seed is not None
    return seed


def _token_files(path: Path) -> tuple[list[Path], Path]:
    if path.is_dir():
        return list_token_files(path), path
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    if path.suffix not in DATA_FILE_EXTENSIONS:
        raise DataError(f"{path} is not a token file ({', '.join(DATA_FILE_EXTENSIONS)})")
    return [path], path.parent


def _open_sequences(
    path: Path, seq_len: int, token_size: int | None, seed: bytes | None
) -> TokenSequences:
    files, directory = _token_files(path)
    size = parse_token_size(token_size or recorded_token_size(directory))
    return TokenSequences.from_files(files, size, seq_len, seed, str(path))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Tokenize text into token files and inspect token files."""


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--seq-len", type=click.IntRange(min=1), required=True, help="Tokens per sequence.")
@click.option(
    "--index",
    type=click.IntRange(min=0),
    required=True,
    help="Index of the sequence to print (0-based, in the seeded order when a seed is given).",
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path),
    help="tokenizer.json to decode the tokens to text with (default: print the token ids).",
)
@click.option(
    "--token-size",
    type=click.Choice(["2", "4"]),
    help="Bytes per token (default: as recorded in metadata.json by `tokenize`, else 2).",
)
@click.option(
    "--shuffle-seed",
    help="Read the sequences in the seeded shuffled order of this seed: 64 hex digits or 32 "
    "comma-separated integers 0-255 (data.toml's shuffle_seed).",
)
@click.option(
    "--no-shuffle",
    is_flag=True,
    help="Ignore --shuffle-seed and read in file order (the default without a seed).",
)
@click.option(
    "--keep-special-tokens", is_flag=True, help="Decode special tokens too (default: skip them)."
)
def inspect(
    path: Path,
    seq_len: int,
    index: int,
    tokenizer: Path | None,
    token_size: str | None,
    shuffle_seed: str | None,
    no_shuffle: bool,
    keep_special_tokens: bool,
) -> None:
    """Print sequence INDEX of the token file (or directory of token files) PATH."""
    seed = None if no_shuffle or shuffle_seed is None else _parse_seed(shuffle_seed)
    try:
        sequences = _open_sequences(path, seq_len, int(token_size) if token_size else None, seed)
        tokens = sequences.sequence(index).tolist()
        if tokenizer is None:
            output = " ".join(map(str, tokens)) + "\n"
        else:
            output = _decoder(tokenizer)(tokens, not keep_special_tokens)
    except (DataError, OSError) as exc:
        _fail(str(exc))
    sys.stdout.buffer.write(output.encode("utf-8"))
    sys.stdout.flush()


def _decoder(path: Path) -> Any:
    import tokenizers

    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:
        raise DataError(f"cannot load tokenizer {path}: {exc}") from None
    return lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip)


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--seq-len", type=click.IntRange(min=1), required=True, help="Tokens per sequence.")
@click.option(
    "--token-size",
    type=click.Choice(["2", "4"]),
    help="Bytes per token (default: as recorded in metadata.json by `tokenize`, else 2).",
)
def info(path: Path, seq_len: int, token_size: str | None) -> None:
    """Print the files, token and sequence counts of PATH as one JSON object."""
    try:
        sequences = _open_sequences(path, seq_len, int(token_size) if token_size else None, None)
    except (DataError, OSError) as exc:
        _fail(str(exc))
    summary = {
        "files": sequences.names,
        "tokens": sequences.num_tokens,
        "seq_len": seq_len,
        "sequences": sequences.num_sequences,
    }
    click.echo(json.dumps(summary))


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path),
    required=True,
    help="Directory for the token files and metadata.json (created if missing).",
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path),
    help="tokenizer.json to encode with (default: raw UTF-8 bytes, vocabulary 256).",
)
@click.option(
    "--token-size",
    type=click.Choice(["2", "4"]),
    help="Bytes per output token (default: the smallest that fits the vocabulary).",
)
@click.option(
    "--text-field",
    default="text",
    show_default=True,
    help="Field holding the text in jsonl and parquet inputs.",
)
@click.option("--eos-token", help="End-of-document token to append (default: auto-detected).")
@click.option("--no-eos", is_flag=True, help="Do not append an end-of-document token.")
@click.option(
    "--shard-tokens",
    type=click.IntRange(min=1),
    default=1 << 28,
    show_default=True,
    help="Maximum tokens per output file.",
)
def tokenize(
    inputs: tuple[Path, ...],
    output: Path,
    tokenizer: Path | None,
    token_size: str | None,
    text_field: str,
    eos_token: str | None,
    no_eos: bool,
    shard_tokens: int,
) -> None:
    """Tokenize text/jsonl/parquet INPUTS into token files in --output."""
    from psyche_common.data.tokenize import byte_encoder, tokenize_files, tokenizer_encoder

    try:
        encoder = (
            byte_encoder()
            if tokenizer is None
            else tokenizer_encoder(tokenizer, eos=not no_eos, eos_token=eos_token)
        )
        total = sum(p.stat().st_size for p in inputs if p.is_file())
        with click.progressbar(length=total, label="tokenizing", file=sys.stderr) as bar:
            summary = tokenize_files(
                list(inputs),
                output,
                encoder,
                int(token_size) if token_size else None,
                text_field,
                shard_tokens,
                bar.update,
            )
    except (DataError, OSError) as exc:
        _fail(str(exc))
    click.echo(
        f"wrote {summary.tokens} tokens of {summary.documents} documents to "
        f"{len(summary.files)} file(s) in {output} ({summary.token_size}-byte tokens)",
        err=True,
    )
