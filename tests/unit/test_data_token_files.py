"""Token files: formats, headers, sequence cutting, shuffling and error messages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from psyche_common.config.data_location import DontShuffle, SeededShuffle
from psyche_common.config.enums import TokenSize
from psyche_common.data.errors import DataFileError, DataIndexError
from psyche_common.data.token_files import (
    SequenceTable,
    TokenSequences,
    list_token_files,
    open_token_file,
    parse_shuffle,
    parse_token_size,
    sequence_table,
    shuffled_order,
)

SEED = bytes(range(1, 33))


def write_tokens(path: Path, tokens: list[int] | np.ndarray, dtype: str = "<u2") -> Path:
    path.write_bytes(np.asarray(tokens, dtype=dtype).tobytes())
    return path


def test_parse_token_size_accepts_names_and_widths() -> None:
    assert parse_token_size("TwoBytes") is TokenSize.TWO_BYTES
    assert parse_token_size("fourbytes") is TokenSize.FOUR_BYTES
    assert parse_token_size(2) is TokenSize.TWO_BYTES
    assert parse_token_size("4") is TokenSize.FOUR_BYTES
    with pytest.raises(DataFileError, match="Unsupported token bytes length 3"):
        parse_token_size(3)


def test_parse_shuffle_forms() -> None:
    assert parse_shuffle(None) is None
    assert parse_shuffle("DontShuffle") is None
    assert parse_shuffle(DontShuffle()) is None
    assert parse_shuffle({"Seeded": list(SEED)}) == SEED
    assert parse_shuffle(SeededShuffle(seed=tuple(SEED))) == SEED
    assert parse_shuffle(list(SEED)) == SEED
    with pytest.raises(DataFileError, match="exactly 32 bytes"):
        parse_shuffle(b"short")
    with pytest.raises(DataFileError, match="0-255"):
        parse_shuffle([300] * 32)


def test_raw_little_endian_two_and_four_bytes(tmp_path: Path) -> None:
    two = tmp_path / "a.bin"
    two.write_bytes(bytes([1, 0, 0x40, 1]))
    assert open_token_file(two, TokenSize.TWO_BYTES).tolist() == [1, 320]
    four = write_tokens(tmp_path / "b.ds", [70000, 5], "<u4")
    assert open_token_file(four, TokenSize.FOUR_BYTES).tolist() == [70000, 5]


def test_headerless_npy_is_raw_tokens(tmp_path: Path) -> None:
    path = tmp_path / "nanoset.npy"
    path.write_bytes(bytes([1, 0, 0x40, 1]))
    assert open_token_file(path, TokenSize.TWO_BYTES).tolist() == [1, 320]


def test_real_npy_header_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "real.npy"
    np.save(path, np.arange(10, dtype="<u2"))
    assert open_token_file(path, TokenSize.TWO_BYTES).tolist() == list(range(10))
    np.save(path, np.arange(6, dtype="<u4").reshape(2, 3))
    assert open_token_file(path, TokenSize.FOUR_BYTES).tolist() == list(range(6))


def test_npy_header_dtype_must_match_token_size(tmp_path: Path) -> None:
    path = tmp_path / "real.npy"
    np.save(path, np.arange(10, dtype="<u4"))
    with pytest.raises(DataFileError, match=r"real\.npy.*wrong token size"):
        open_token_file(path, TokenSize.TWO_BYTES)
    np.save(path, np.arange(10, dtype="<f2"))
    with pytest.raises(DataFileError, match="does not match"):
        open_token_file(path, TokenSize.TWO_BYTES)


def test_wrong_token_size_names_the_file(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "odd.bin", [1, 2, 3])  # 6 bytes
    with pytest.raises(DataFileError, match=r"odd\.bin is 6 bytes.*4-byte.*wrong token size"):
        open_token_file(path, TokenSize.FOUR_BYTES)


def test_empty_file_has_no_tokens(tmp_path: Path) -> None:
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    assert len(open_token_file(path, TokenSize.TWO_BYTES)) == 0


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=r"cannot open token file .*nope\.bin"):
        open_token_file(tmp_path / "nope.bin", TokenSize.TWO_BYTES)


def test_sequence_table_uses_every_full_sequence() -> None:
    sources, offsets = sequence_table([6, 5, 2, 0], 2)
    # 3 from the first file (exact multiple: the last one is kept), 2 from the second
    # (one spare token), 1 from the third, none from the empty one
    assert sources.tolist() == [0, 0, 0, 1, 1, 2]
    assert offsets.tolist() == [0, 2, 4, 0, 2, 0]


def test_file_shorter_than_a_sequence_gives_none() -> None:
    sources, offsets = sequence_table([3], 2048)
    assert len(sources) == 0 and len(offsets) == 0


def test_sequence_table_rejects_bad_seq_len() -> None:
    with pytest.raises(DataFileError, match="sequence length must be positive"):
        sequence_table([10], 0)


def test_shuffled_order_is_a_seeded_permutation() -> None:
    order = shuffled_order(1000, SEED)
    assert sorted(order.tolist()) == list(range(1000))
    assert order.tolist() != list(range(1000))
    assert shuffled_order(1000, SEED).tolist() == order.tolist()
    assert shuffled_order(1000, bytes(32)).tolist() != order.tolist()
    assert shuffled_order(0, SEED).tolist() == []


def test_shuffled_order_is_pinned() -> None:
    # the order is part of the data contract between machines: pin it
    assert shuffled_order(8, SEED).tolist() == PINNED_ORDER


PINNED_ORDER = [1, 2, 0, 4, 5, 3, 6, 7]


def test_list_token_files_sorted_top_level_only(tmp_path: Path) -> None:
    for name in ["b.ds", "a.npy", "c.bin", "notes.txt", "LICENSE.md"]:
        (tmp_path / name).write_bytes(b"\0\0")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "0.bin").write_bytes(b"\0\0")
    assert [p.name for p in list_token_files(tmp_path)] == ["a.npy", "b.ds", "c.bin"]


def test_list_token_files_errors(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(DataFileError, match="No training data files in directory"):
        list_token_files(tmp_path)
    with pytest.raises(DataFileError, match="does not exist"):
        list_token_files(tmp_path / "missing")


def test_token_sequences_reads_across_files(tmp_path: Path) -> None:
    a = write_tokens(tmp_path / "a.bin", range(0, 7))
    b = write_tokens(tmp_path / "b.bin", range(100, 106))
    seqs = TokenSequences.from_files([a, b], TokenSize.TWO_BYTES, 3)
    assert seqs.num_sequences == 4
    batch = seqs.read(0, 3)
    assert batch.dtype == np.int64 and batch.shape == (4, 3)
    assert batch.tolist() == [[0, 1, 2], [3, 4, 5], [100, 101, 102], [103, 104, 105]]
    assert seqs.locate(2) == (str(b), 0)
    assert [s.tolist() for s in seqs] == batch.tolist()


def test_token_sequences_shuffled_is_a_permutation_of_unshuffled(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "a.bin", range(64))
    plain = TokenSequences.from_files([path], TokenSize.TWO_BYTES, 4)
    shuffled = TokenSequences.from_files([path], TokenSize.TWO_BYTES, 4, SEED)
    rows = shuffled.read(0, 15).tolist()
    assert rows != plain.read(0, 15).tolist()
    assert sorted(rows) == plain.read(0, 15).tolist()


def test_out_of_range_index_message(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "a.bin", range(9))
    seqs = TokenSequences.from_files([path], TokenSize.TWO_BYTES, 3)
    with pytest.raises(
        DataIndexError, match=r"index 7 is out of bounds: the data has 3 sequences.*a\.bin"
    ):
        seqs.read(2, 7)
    with pytest.raises(DataIndexError, match="empty sample range"):
        seqs.read(2, 1)
    with pytest.raises(IndexError):
        seqs.sequence(-1)


def test_sequence_table_description_in_errors() -> None:
    table = SequenceTable([4], 2, description="http://h/x.ds")
    with pytest.raises(DataIndexError, match=r"index 2 .* 2 sequences .*http://h/x\.ds"):
        table.locate(2)


def test_mmap_failure_falls_back_only_when_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_tokens(tmp_path / "a.bin", [5, 6, 7])

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(np, "memmap", refuse)
    monkeypatch.delenv("ALLOW_FAIL_MMAP", raising=False)
    with pytest.raises(DataFileError, match=r"cannot memory-map token file .*a\.bin"):
        open_token_file(path, TokenSize.TWO_BYTES)
    monkeypatch.setenv("ALLOW_FAIL_MMAP", "yes")
    assert open_token_file(path, TokenSize.TWO_BYTES).tolist() == [5, 6, 7]
