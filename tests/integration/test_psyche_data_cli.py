"""The installed ``psyche-data`` script, run as a subprocess on the reference fixtures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "psyche-data"

CASES = [
    ("fineweb", "fineweb/data/00000_00000_shuffled.ds"),
    ("fineweb", "fineweb/data"),
    ("dolma", "dolma/data/dolma-v1_7-30B-tokenized-llama2-nanoset.npy"),
    ("dolma", "dolma/data"),
]


def run(*args: str) -> subprocess.CompletedProcess[bytes]:
    if not SCRIPT.exists():
        pytest.skip(f"{SCRIPT} is not installed (pip install -e .)")
    return subprocess.run([str(SCRIPT), *args], capture_output=True, timeout=120, check=False)


@pytest.mark.parametrize(("name", "target"), CASES)
@pytest.mark.parametrize("index", [0, 1])
def test_inspect_decodes_reference_sequences(
    shared_fixtures: Path, name: str, target: str, index: int
) -> None:
    data = shared_fixtures / "data"
    result = run(
        "inspect",
        str(data / target),
        "--seq-len",
        "2048",
        "--index",
        str(index),
        "--no-shuffle",
        "--tokenizer",
        str(data / "llama2_tokenizer.json"),
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == (data / name / "decoded" / f"{index}.txt").read_bytes()


def test_inspect_out_of_range_exits_1_with_stderr_only(shared_fixtures: Path) -> None:
    data = shared_fixtures / "data"
    result = run("inspect", str(data / "dolma" / "data"), "--seq-len", "2048", "--index", "7")
    assert result.returncode == 1 and result.stdout == b""
    assert b"index 7 is out of bounds: the data has 3 sequences" in result.stderr


def test_tokenize_then_inspect(tmp_path: Path) -> None:
    source = tmp_path / "docs.jsonl"
    source.write_text('{"text": "0123456789"}\n')
    tokenized = run("tokenize", str(source), "--output", str(tmp_path / "out"))
    assert tokenized.returncode == 0, tokenized.stderr.decode()
    assert tokenized.stdout == b"" and b"wrote 10 tokens" in tokenized.stderr
    shown = run("inspect", str(tmp_path / "out"), "--seq-len", "5", "--index", "1")
    assert shown.stdout == b"53 54 55 56 57\n"


def test_unreadable_metadata_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "tokens.bin").write_bytes(bytes(range(16)))
    (tmp_path / "metadata.json").write_text("{not json")
    result = run("info", str(tmp_path), "--seq-len", "2")
    assert result.returncode == 1 and result.stdout == b""
    assert f"unreadable {tmp_path / 'metadata.json'}".encode() in result.stderr
    explicit = run("info", str(tmp_path), "--seq-len", "2", "--token-size", "2")
    assert explicit.returncode == 0, explicit.stderr.decode()
