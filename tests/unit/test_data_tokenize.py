"""Tokenizing text/jsonl/parquet into token files, and the psyche-data CLI in-process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from psyche_common.data.cli import main
from psyche_common.data.errors import DataFileError
from psyche_common.data.tokenize import (
    ShardWriter,
    byte_encoder,
    choose_token_size,
    iter_documents,
    tokenize_files,
    tokenizer_encoder,
)


def test_iter_documents_formats(tmp_path: Path) -> None:
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text('{"text": "one"}\n\n{"text": "two", "id": 2}\n')
    assert [t for t, _ in iter_documents(jsonl)] == ["one", "", "two"]
    assert sum(n for _, n in iter_documents(jsonl)) == jsonl.stat().st_size
    parquet = tmp_path / "b.parquet"
    pq.write_table(pa.table({"body": ["x", None, "z"]}), parquet)
    assert [t for t, _ in iter_documents(parquet, "body")] == ["x", "", "z"]
    text = tmp_path / "c.txt"
    text.write_text("whole file\nis one document")
    assert [t for t, _ in iter_documents(text)] == ["whole file\nis one document"]


def test_iter_documents_errors(tmp_path: Path) -> None:
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(DataFileError, match=r"bad\.jsonl:2: no string field 'text'"):
        list(iter_documents(jsonl))
    jsonl.write_text('{"text": 5}\n')
    with pytest.raises(DataFileError, match="is not a string"):
        list(iter_documents(jsonl))
    parquet = tmp_path / "p.parquet"
    pq.write_table(pa.table({"body": ["x"]}), parquet)
    with pytest.raises(DataFileError, match="has no column 'text'"):
        list(iter_documents(parquet))
    binary = tmp_path / "x.txt"
    binary.write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(DataFileError, match="not UTF-8"):
        list(iter_documents(binary))


def test_choose_token_size() -> None:
    assert choose_token_size(256, None) == 2
    assert choose_token_size(65536, None) == 2
    assert choose_token_size(128256, None) == 4
    assert choose_token_size(256, 4) == 4
    with pytest.raises(DataFileError, match="do not fit in 2 bytes"):
        choose_token_size(128256, 2)


def test_shard_writer_splits_and_checks_range(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path, 2, shard_tokens=4)
    writer.write([1, 2, 3])
    writer.write([4, 5, 6, 7, 8, 9])
    writer.close()
    assert [p.name for p in writer.paths] == ["part-00000.bin", "part-00001.bin", "part-00002.bin"]
    assert [np.fromfile(p, "<u2").tolist() for p in writer.paths] == [
        [1, 2, 3, 4],
        [5, 6, 7, 8],
        [9],
    ]
    assert not list(tmp_path.glob(".*.tmp"))
    bad = ShardWriter(tmp_path / "bad", 2, 10)
    with pytest.raises(DataFileError, match="does not fit"):
        bad.write([70000])
    bad.close()


def test_tokenize_bytes(tmp_path: Path) -> None:
    source = tmp_path / "a.jsonl"
    source.write_text('{"text": "hé"}\n{"text": "!"}\n')
    summary = tokenize_files([source], tmp_path / "out", byte_encoder())
    assert summary.tokens == 4 and summary.documents == 2 and summary.token_size == 2
    assert np.fromfile(summary.files[0], "<u2").tolist() == [104, 0xC3, 0xA9, 33]
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert metadata["token_size"] == 2 and metadata["tokenizer"] == "bytes"


def test_tokenize_missing_input(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="is not a file"):
        tokenize_files([tmp_path / "nope.txt"], tmp_path / "out", byte_encoder())


def test_tokenizer_adds_bos_and_eos(shared_fixtures: Path, tmp_path: Path) -> None:
    encoder = tokenizer_encoder(shared_fixtures / "data" / "llama2_tokenizer.json")
    assert encoder.eos_id == 2
    assert encoder.encode_batch(["Hello world"]) == [[1, 15043, 3186, 2]]
    no_eos = tokenizer_encoder(shared_fixtures / "data" / "llama2_tokenizer.json", eos=False)
    assert no_eos.encode_batch(["Hello world"]) == [[1, 15043, 3186]]
    with pytest.raises(DataFileError, match="has no token '<nope>'"):
        tokenizer_encoder(shared_fixtures / "data" / "llama2_tokenizer.json", eos_token="<nope>")
    with pytest.raises(DataFileError, match="cannot load tokenizer"):
        tokenizer_encoder(tmp_path / "missing.json")


def test_cli_tokenize_then_inspect_round_trip(tmp_path: Path) -> None:
    source = tmp_path / "doc.txt"
    source.write_text("abcdefgh")
    runner = CliRunner()
    result = runner.invoke(main, ["tokenize", str(source), "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        main, ["inspect", str(tmp_path / "out"), "--seq-len", "4", "--index", "1"]
    )
    assert result.exit_code == 0 and result.stdout == "101 102 103 104\n"
    result = runner.invoke(
        main, ["inspect", str(tmp_path / "out"), "--seq-len", "4", "--index", "2"]
    )
    assert result.exit_code == 1
    assert "index 2 is out of bounds: the data has 2 sequences" in result.stderr
    assert result.stdout == ""


def test_cli_inspect_shuffled_and_info(tmp_path: Path) -> None:
    np.arange(400, dtype="<u4").tofile(tmp_path / "a.bin")
    runner = CliRunner()
    args = ["inspect", str(tmp_path / "a.bin"), "--seq-len", "4", "--token-size", "4"]
    plain = runner.invoke(main, [*args, "--index", "0"])
    assert plain.stdout == "0 1 2 3\n"
    seeded = runner.invoke(main, [*args, "--index", "0", "--shuffle-seed", "ab" * 32])
    assert seeded.exit_code == 0 and seeded.stdout != plain.stdout
    as_list = ",".join(["171"] * 32)
    assert runner.invoke(main, [*args, "--index", "0", "--shuffle-seed", as_list]).stdout == (
        seeded.stdout
    )
    forced = runner.invoke(
        main, [*args, "--index", "0", "--shuffle-seed", "ab" * 32, "--no-shuffle"]
    )
    assert forced.stdout == plain.stdout
    bad = runner.invoke(main, [*args, "--index", "0", "--shuffle-seed", "abc"])
    assert bad.exit_code == 2
    info = runner.invoke(main, ["info", str(tmp_path), "--seq-len", "4", "--token-size", "4"])
    assert json.loads(info.stdout)["sequences"] == 100


def test_cli_inspect_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["inspect", str(tmp_path), "--seq-len", "4", "--index", "0"])
    assert result.exit_code == 1 and "No training data files" in result.stderr
    (tmp_path / "odd.bin").write_bytes(b"\0" * 6)
    result = runner.invoke(
        main,
        [
            "inspect",
            str(tmp_path / "odd.bin"),
            "--seq-len",
            "1",
            "--index",
            "0",
            "--token-size",
            "4",
        ],
    )
    assert result.exit_code == 1 and "wrong token size" in result.stderr
    result = runner.invoke(
        main, ["inspect", str(tmp_path / "x.txt"), "--seq-len", "1", "--index", "0"]
    )
    assert result.exit_code == 1 and "does not exist" in result.stderr
